"""Rules: the registry of every rule tieaudit emits, one module per rule family, and the policy."""
