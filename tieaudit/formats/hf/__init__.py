"""Hugging Face repositories as their libraries lay them out (``layouts``): which folder is a model,
which a module or component of a larger unit, and which holds no model at all."""
