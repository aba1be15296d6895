"""Run by Python at the start of each process Spark starts for an Elastiq session (this folder
is on their `PYTHONPATH`, executor/spark_python_path.py): import pyspark from the installed,
compiled package instead of Spark's `pyspark.zip`. Never fails a process: on any error the path
is left as it was. Then runs the `sitecustomize` this file hides, if the path holds one."""

import importlib.machinery
import importlib.util
import os
import sys


def _reorder() -> None:
    from executor.spark_python_path import prefer_installed_pyspark

    sys.path[:] = prefer_installed_pyspark(sys.path)


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here and not p.endswith(".zip")]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


try:
    _reorder()
except Exception:  # a failure here must not stop Spark's Python process
    pass
try:
    _chain()
except Exception:
    pass
