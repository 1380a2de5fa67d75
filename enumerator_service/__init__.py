"""Sluice work discovery: settings, schema, splits, the split store and enumerators."""

from enumerator_service._assignment_tracker import NO_CHECKPOINT, SplitAssignmentTracker
from enumerator_service._checkpoint_store import (
    AbortCause,
    Acknowledgement,
    CheckpointStore,
    CompletedCheckpoint,
    StagedTransaction,
    TransactionalSink,
    acknowledge,
    recover,
)
from enumerator_service._config import (
    ConfigError,
    Settings,
    load_settings,
    redact_url,
    validate_identifier,
)
from enumerator_service._database import (
    SchemaError,
    asyncpg_dsn,
    connect_engine,
    database_url,
    read_password_file,
    require_current_schema,
    upgrade_schema,
)
from enumerator_service._enumerator import DiscoveryResult, SplitEnumerator
from enumerator_service._file_enumerators import ContinuousFileEnumerator, StaticFileEnumerator
from enumerator_service._file_identity import (
    ChangePolicy,
    FileChangedError,
    FileIdentity,
    change_time,
    modification_time,
)
from enumerator_service._identifiers import qualified_name, quote_identifier
from enumerator_service._landing import LandingRoot, OutsideLandingError
from enumerator_service._secret_files import SECRETS_FOLDER, new_secret_file, sweep_secret_files
from enumerator_service._secrets import redact_text, split_password, with_password
from enumerator_service._split_store import FencedError, SplitStore
from enumerator_service._splits import (
    FileSplit,
    Split,
    SplitAssignment,
    SplitState,
    TableRangeSplit,
)
from enumerator_service._storage import (
    OBJECT_STORE_SCHEMES,
    Location,
    StorageOptions,
    is_uri,
    open_location,
)
from enumerator_service._table_enumerator import TableRangeEnumerator
from enumerator_service._task_watermarks import committed_task_watermark

__all__ = [
    "NO_CHECKPOINT",
    "OBJECT_STORE_SCHEMES",
    "SECRETS_FOLDER",
    "AbortCause",
    "Acknowledgement",
    "ChangePolicy",
    "CheckpointStore",
    "CompletedCheckpoint",
    "ConfigError",
    "ContinuousFileEnumerator",
    "DiscoveryResult",
    "FencedError",
    "FileChangedError",
    "FileIdentity",
    "FileSplit",
    "LandingRoot",
    "Location",
    "OutsideLandingError",
    "SchemaError",
    "Settings",
    "Split",
    "SplitAssignment",
    "SplitAssignmentTracker",
    "SplitEnumerator",
    "SplitState",
    "SplitStore",
    "StagedTransaction",
    "StaticFileEnumerator",
    "StorageOptions",
    "TableRangeEnumerator",
    "TableRangeSplit",
    "TransactionalSink",
    "acknowledge",
    "asyncpg_dsn",
    "change_time",
    "committed_task_watermark",
    "connect_engine",
    "database_url",
    "is_uri",
    "load_settings",
    "modification_time",
    "new_secret_file",
    "open_location",
    "qualified_name",
    "quote_identifier",
    "read_password_file",
    "recover",
    "redact_text",
    "redact_url",
    "require_current_schema",
    "split_password",
    "sweep_secret_files",
    "upgrade_schema",
    "validate_identifier",
    "with_password",
]
