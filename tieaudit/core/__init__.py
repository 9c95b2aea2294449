"""The bottom layer: records, byte access, errors and text handling every stage shares."""
