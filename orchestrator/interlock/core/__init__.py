"""The pure core of Interlock: the manifest language, its compiler and the run engine.

Nothing in this package reads a clock, draws a random number or does I/O: time and ids come
from the caller. The shell (``interlock.runtime``) reads logs, calls :func:`decide`, appends
what it returns and acts on it.
"""
