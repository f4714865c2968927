"""The offset store on a SQL database, shared by the database rooms (``mysql``, ``postgres``): one SQL text, a
dialect for what databases spell differently, no driver import."""
