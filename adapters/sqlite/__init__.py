"""SQLite: the embedded runtime's views (views.py), the optional SQLite mailbox
(mailbox.py), the connection settings both use (connect.py) and rebuild/verify's file
surgery (rebuild.py)."""
