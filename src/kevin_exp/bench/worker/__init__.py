"""Everything that runs inside the candidate's sandboxed runner process (``python -m kevin_exp.bench.worker``).

- ``entry``: the process: sandbox set-up, warm-up, the no-new-tasks filter, then the runner.
- ``sandbox_setup``: mounts, uid and resource limits, from inside fresh namespaces.
- ``runner``: loads the candidate, builds ``ModelNew`` and serves trials (inputs in, outputs and own timing out).
- ``candidate``: where candidate code is loaded (the ``load_inline`` hook, extension call counting).
- ``timing``: the timing method (cache flush, CUDA events closed by a device-wide sync), shared with the
  trusted reference process.
- ``outcomes``: how a runner refuses a candidate (``Rejected``, ``NeedsBuild``).

``reference``, ``comparison`` and ``tensors`` hold the trusted reference process's helpers
(``kevin_exp.bench.reference_server``); the runner never checks its own outputs.
"""
