from tests.integration.conftest import *  # noqa: F401,F403  (the same broker fixtures)
