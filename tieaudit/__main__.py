"""``python -m tieaudit``: the same command line as the ``tieaudit`` script."""

from tieaudit.cli.launch import main

if __name__ == "__main__":
    raise SystemExit(main())
