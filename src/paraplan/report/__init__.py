"""What people read: rich tables and number formats (tables.py), the HTML report of a comparison
(html.py)."""
