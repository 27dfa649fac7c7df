from localinfer.errors import (
    ChecksumError,
    ContextOverflowError,
    ExitCode,
    InvalidModelError,
    LocalInferError,
    ModelNotFoundError,
    NetworkError,
    UsageError,
    exit_code_for,
)


def test_exit_code_table_subclasses_before_bases():
    assert exit_code_for(ChecksumError("x")) == ExitCode.BAD_MODEL == 4
    assert exit_code_for(InvalidModelError("x")) == 4
    assert exit_code_for(ModelNotFoundError("x")) == 3
    assert exit_code_for(UsageError("x")) == 2
    assert exit_code_for(NetworkError("x")) == 5
    assert exit_code_for(ContextOverflowError("x")) == 6
    assert exit_code_for(LocalInferError("x")) == 1
    assert exit_code_for(KeyboardInterrupt()) == 130
    assert exit_code_for(ValueError("unexpected")) == 1
