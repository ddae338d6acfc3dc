"""One document's conversion: its pages through the engine, in order, within the memory
budget."""
