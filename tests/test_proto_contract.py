"""Wire-contract rules that buf does not enforce for us, checked on the generated descriptors."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from google.protobuf.descriptor import Descriptor, EnumDescriptor, FileDescriptor

from echo_proto.budget.v1 import budget_pb2
from echo_proto.serving.v1 import serving_pb2

FILES = [serving_pb2.DESCRIPTOR, budget_pb2.DESCRIPTOR]
MAX_FIELD_NUMBER = 2**29 - 1
RESERVED_BY_PROTOBUF = range(19_000, 20_000)


def _messages(file: FileDescriptor) -> Iterator[Descriptor]:
    stack = list(file.message_types_by_name.values())
    while stack:
        message = stack.pop()
        yield message
        stack.extend(message.nested_types)


def _enums(file: FileDescriptor) -> Iterator[EnumDescriptor]:
    yield from file.enum_types_by_name.values()
    for message in _messages(file):
        yield from message.enum_types


def _upper_snake(name: str) -> str:
    return "".join(f"_{c}" if c.isupper() and i else c for i, c in enumerate(name)).upper()


@pytest.mark.parametrize("file", FILES, ids=lambda f: f.name)
def test_every_enum_starts_with_unspecified_zero(file: FileDescriptor) -> None:
    enums = list(_enums(file))
    for enum in enums:
        zero = enum.values_by_number.get(0)
        assert zero is not None, f"{enum.full_name} has no zero value"
        assert zero.name == f"{_upper_snake(enum.name)}_UNSPECIFIED", enum.full_name
    if file is serving_pb2.DESCRIPTOR:
        assert [e.name for e in enums] == ["FinishReason"]


@pytest.mark.parametrize("file", FILES, ids=lambda f: f.name)
def test_field_numbers_are_unique_and_in_range(file: FileDescriptor) -> None:
    for message in _messages(file):
        numbers = [field.number for field in message.fields]
        assert len(numbers) == len(set(numbers)), f"{message.full_name}: {sorted(numbers)}"
        for number in numbers:
            assert 1 <= number <= MAX_FIELD_NUMBER, f"{message.full_name}: {number}"
            assert number not in RESERVED_BY_PROTOBUF, f"{message.full_name}: {number}"


@pytest.mark.parametrize("file", FILES, ids=lambda f: f.name)
def test_rpc_types_belong_to_the_file_package(file: FileDescriptor) -> None:
    for service in file.services_by_name.values():
        for method in service.methods:
            for message in (method.input_type, method.output_type):
                assert message.file is file, f"{method.full_name} uses {message.full_name}"
