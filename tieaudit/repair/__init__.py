"""retie: the plan, one writer per format, restore, verify (tieaudit and the reference loaders), publish."""

STAGE_INFIX = ".tieaudit-stage-"
"""In the name of the folder a write is staged in beside OUT (check skips such names)."""
BACKUP_SUFFIX = ".tieaudit-backup"
"""Where --in-place keeps the original: IN + this suffix (check skips such names)."""
LEGACY_BACKUP_SUFFIX = ".bak"
"""The backup suffix of earlier versions: an interrupted run of one may have left IN.bak."""
