"""dalle_dist: DALL-E style text-to-image training whose distributed backend is a flag."""

__version__ = "0.1.0"
