# The helper modules beside the tests assert too: pytest explains their failures as it does a test's
# only for modules registered before they are imported, and this package is imported first.
import pytest

pytest.register_assert_rewrite(
    "tests.catalog.modelfiles_support", "tests.operations.resize_api_support", "tests.web.pages_support"
)
