"""Configuration: the typed settings, where they are read from, and the folder layout they
describe."""
