"""Every block passes Prefect's own ``BlockStandardTestSuite``, as every first-party
integration's ``tests/test_block_standards.py`` does: a description, a documentation
URL, a description (ending in a period) on every field, a code example that imports
and loads the block (its logo check downloads the image, and Prefect skips it without
Pillow, which this project does not install)."""

from __future__ import annotations

import pytest
from prefect.blocks.core import Block
from prefect.testing.standard_test_suites import BlockStandardTestSuite

from prefect_runpod.blocks import catalog

BLOCKS = [getattr(catalog, name) for name in catalog.__all__]


@pytest.mark.parametrize("block", BLOCKS, indirect=True, ids=lambda b: b.__name__)
class TestAllBlocksAdhereToStandards(BlockStandardTestSuite):
    @pytest.fixture
    def block(self, request: pytest.FixtureRequest) -> type[Block]:
        return request.param
