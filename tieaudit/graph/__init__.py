"""The alias graph (who shares storage, with which relation), block comparison and the staged copy search."""
