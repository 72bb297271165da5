"""Everything that runs inside one sandboxed worker process (``python -m kevin_exp.bench.worker``).

- ``entry``: the process: sandbox set-up, warm-up, one job in, one signed result out.
- ``sandbox_setup``: mounts, uid and resource limits, from inside fresh namespaces.
- ``evaluation``: the evaluation loop for the job.
- ``candidate``: where candidate code is loaded (the ``load_inline`` hook, extension call counting).
- ``reference``, ``comparison``, ``tensors``: the reference program and its inputs, judging outputs, tensor
  plumbing; none of them loads or calls candidate code.
- ``timing``: reference and candidate timed in interleaved trials.
- ``outcomes``: how a job ends early (``Rejected``, ``NeedsBuild``).
"""
