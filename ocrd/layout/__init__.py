"""A page's structure found in the geometry of its words — paragraphs, lists, tables,
headings, columns and their reading order — and written as Markdown (`page.to_markdown`).
The CPU engine (engines/tesseract.py) hands its words over as a `reading.Reading`."""
