"""Small utilities shared by every stage: byte sizes, durable files, JSON lines, processes."""
