"""The confinement of a process that runs code fuseval does not trust.

* :mod:`.confine`: what a worker process does to itself before it imports anything of the
  implementation's (its own session, capabilities dropped, a seccomp filter through
  libseccomp, a Landlock domain), and the probe of which of these the machine offers;
* :mod:`.procs`: what fuseval's process reads of a worker from outside (its session's
  processes, its CPU time, its memory map) and how it ends the processes a worker left;
* :mod:`.transport`: inputs the worker can read but never change, and output buffers it
  writes, on the CPU (sealed memfds) and on CUDA (a memory pool of their own).

Nothing here imports torch at module level: :func:`confine.enter` runs in a fresh worker
before torch starts its first thread.
"""

# seconds a case may take in the implementation (every call of the case together); the
# first call of a GPU kernel includes its compilation
DEFAULT_TIMEOUT = 300.0
