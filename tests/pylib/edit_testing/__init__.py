"""Helpers shared by the Python tests (tests/) and the benchmark drivers (bench/).

ctest puts tests/pylib on PYTHONPATH for every Python test (tests/CMakeLists.txt); the
bench drivers find it through bench/common.py. Standard library only, so that any
python3 runs it (Debian's /usr/bin/python3 for the torch reference, too).

    paths          where the build, the binaries, the stand-in and the CRD are; find_kubectl
    net            free_port
    logs           the workers' `@edit` / `@edit-summary` lines: parse, summaries, progress
    edit_run       one launcher for edit-run (--log-dir), and edit-train started as a pod
    data           make_data: a small generated corpus as token files
    ckpt           an independent reader of checkpoint files; checkpoints(), weights_finite()
    cpu            openblas_coretype: the OpenBLAS core the runtime picks on this CPU
    cluster        the API stand-in + kubelet + edit-operator (Cluster), pod trackers, job_manifest
    unittest_main  unittest's main that exits 77 (ctest: skipped) when every test skipped
"""
