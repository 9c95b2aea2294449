"""Command line: parse options, call the library, map the outcome to an ExitCode."""
