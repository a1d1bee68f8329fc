"""Django's PostgreSQL backend with one change to its connection pool (see base.py)."""
