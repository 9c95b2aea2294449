"""The architecture sweep: tieaudit's answers checked against live transformers models.

models.py picks the classes and builds tiny configs, variants.py writes each variant's files,
truth.py takes the facts from the live model and the written files, expect.py states what tieaudit
should answer, case.py runs one (class, variant), reload.py loads retie's output with the loaders
people use, run.py runs cases in worker processes and reports. Importing this package imports
nothing heavy: torch and transformers are imported by the modules that need them, in workers.
"""
