"""The only package that imports SQLAlchemy.

Store functions take a ``Session`` and flush, never commit: the caller owns the
transaction (see ``Database.write``).
"""
