"""Engine errors. Each message is one line that names the fix."""


class EngineError(Exception):
    """Base class of every error the engine raises on bad input or a bad environment."""


class ModelNotFoundError(EngineError):
    """Unknown model name or a path that is not a model."""


class ModelIntegrityError(EngineError):
    """A model file is truncated or its checksum does not match."""


class FetchError(EngineError):
    """The package index could not be reached or did not have the package."""


class UnsupportedModelError(EngineError):
    """The checkpoint's architecture or a config value is not supported."""


class ContextTooLongError(EngineError):
    """A prompt (plus its generation budget) does not fit the model's context."""

    def __init__(self, message: str, limit: int, length: int):
        super().__init__(message)
        self.limit = limit
        self.length = length
