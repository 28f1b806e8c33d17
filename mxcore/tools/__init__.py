"""mxcore's tools: the command line (``mxcore`` / ``python -m mxcore``), the benchmarks and the selftest.

They sit on top of the library and use it as a user does (the API, the dtype table, the backend registry and the
backend contract); nothing in the library imports them.  :func:`info` is the report that ``mxcore info`` prints.
"""

from ._info import Info, info

__all__ = ["Info", "info"]
