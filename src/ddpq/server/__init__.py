"""The only package that imports FastAPI."""
