"""specparity: is the speculative path exactly classic decode?"""

__version__ = "0.1.0"
