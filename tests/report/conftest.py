def pytest_configure(config):
    config.addinivalue_line("markers", "chromium: renders the report in headless Chromium (skipped where it is missing)")
