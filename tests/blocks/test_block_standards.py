"""Every block the package registers meets Prefect's block standards (the checks of
``BlockStandardTestSuite`` that need no network): a description, a documentation URL,
a description ending in "." on every field, a runnable code example, secrets as
``SecretStr``."""

from __future__ import annotations

import re

import pytest
from prefect.blocks.core import Block

import prefect_runpod.blocks as blocks_pkg
from prefect_runpod.blocks import catalog

BLOCKS = [getattr(catalog, name) for name in catalog.__all__]


def test_the_package_registers_every_block_in_the_catalog():
    assert sorted(blocks_pkg.__all__) == sorted(catalog.__all__)
    for name in blocks_pkg.__all__:
        assert getattr(blocks_pkg, name) is getattr(catalog, name)
        assert issubclass(getattr(blocks_pkg, name), Block)


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b.__name__)
class TestBlockStandards:
    def test_description_and_documentation_url(self, block: type[Block]) -> None:
        assert block.get_description()
        assert block._documentation_url

    def test_every_field_is_described(self, block: type[Block]) -> None:
        for name, field in block.model_fields.items():
            assert field.description, f"{block.__name__}.{name} has no description"
            assert field.description.rstrip().endswith("."), f"{block.__name__}.{name}"

    def test_code_example_loads_the_block(self, block: type[Block]) -> None:
        example = block.get_code_example() or ""
        assert re.search(rf"from [\w.]+ import {block.__name__}", example)
        assert re.search(rf'{block.__name__}\.load\("BLOCK_NAME"\)', example)

    def test_secret_looking_fields_are_secret(self, block: type[Block]) -> None:
        for name, field in block.model_fields.items():
            if re.search(r"(token|secret|api_key|private_key)$", name):
                assert "SecretStr" in str(field.annotation), f"{block.__name__}.{name}"

    def test_schema_marks_secrets(self, block: type[Block]) -> None:
        schema = block.model_json_schema()
        secret_fields = set(schema.get("secret_fields", []))
        for name, field in block.model_fields.items():
            if "SecretStr" in str(field.annotation):
                assert any(s == name or s.startswith(f"{name}.") for s in secret_fields), name
