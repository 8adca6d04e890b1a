"""One export, read: opening it safely, the schema reader, the decoded tables (``Trace``), interval arithmetic,
which range a GPU operation belongs to, and which rows can be real."""
