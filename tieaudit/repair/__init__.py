"""retie: the plan, one writer per format, restore, verify (tieaudit and the reference loaders), publish."""
