"""Mooncake's vendored suites (upstream/) run in subprocesses on the facade
(test_mooncake_api.py::test_mooncake_own_suite_on_facade), not in this session."""

collect_ignore = ["upstream"]
