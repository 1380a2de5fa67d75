"""Sluice work discovery: settings, schema, splits, the split store and enumerators."""

from enumerator_service._assignment_tracker import NO_CHECKPOINT, SplitAssignmentTracker
from enumerator_service._bookkeeping import prune_finished_runs
from enumerator_service._checkpoint_store import (
    CHECKPOINT_CHANNEL,
    COORDINATOR_CHANNEL,
    AbortCause,
    Acknowledgement,
    CheckpointStore,
    CompletedCheckpoint,
    StagedTransaction,
    TransactionalSink,
    acknowledge,
    encode_dead_letters,
    publish_committed,
    recover,
)
from enumerator_service._completeness import COUNTERS, DETAIL, END_OF_INPUT, completed_partitions
from enumerator_service._completions import (
    PartitionCompletion,
    completions_table_exists,
    mark_reported,
    partition_completions,
    unreported_completions,
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
from enumerator_service._embedded import embedded_state, stop_embedded
from enumerator_service._enumerator import DiscoveryResult, SplitEnumerator
from enumerator_service._file_enumerators import ContinuousFileEnumerator, StaticFileEnumerator
from enumerator_service._file_identity import (
    CHANGED_REASON,
    ChangePolicy,
    FileChangedError,
    FileIdentity,
    change_time,
    check_unchanged,
    modification_time,
)
from enumerator_service._file_identity import current as current_identity
from enumerator_service._identifiers import qualified_name, quote_identifier
from enumerator_service._landing import _PARTITION_DIR as PARTITION_DIR
from enumerator_service._landing import LandingRoot, OutsideLandingError, landing_days
from enumerator_service._landing import _kind_of as kind_of
from enumerator_service._live_state import LiveState, live_state
from enumerator_service._object_landing import (
    ObjectLanding,
    OutsidePrefixError,
    StorageError,
    days_with_files,
    identity_now,
)
from enumerator_service._operations import (
    Discovery,
    EnumeratorDiscovery,
    FileDiscovery,
    Platform,
    PlatformStatus,
    TableDiscovery,
    discover,
    open_platform,
    platform_status,
)
from enumerator_service._quarantine import QuarantinedSplit, quarantined, retry_splits
from enumerator_service._rebuilds import (
    CrossDayRebuildError,
    PartitionBusyError,
    Rebuild,
    RebuildStore,
)
from enumerator_service._safe_paths import child_path, partition_date, relative_under, safe_name
from enumerator_service._schema import (
    ACTIVE_SPLIT,
    SCHEMA,
    CheckpointStatus,
    RebuildStatus,
    SplitStatus,
    dead_letters,
    partition_rebuilds,
    sink_transactions,
    splits,
)
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
    check_uri,
    is_uri,
    open_location,
)
from enumerator_service._table_enumerator import TableRangeEnumerator
from enumerator_service._task_watermarks import committed_task_watermark

__all__ = [
    "ACTIVE_SPLIT",
    "CHANGED_REASON",
    "CHECKPOINT_CHANNEL",
    "COORDINATOR_CHANNEL",
    "COUNTERS",
    "DETAIL",
    "END_OF_INPUT",
    "NO_CHECKPOINT",
    "OBJECT_STORE_SCHEMES",
    "PARTITION_DIR",
    "SCHEMA",
    "SECRETS_FOLDER",
    "AbortCause",
    "Acknowledgement",
    "ChangePolicy",
    "CheckpointStatus",
    "CheckpointStore",
    "CompletedCheckpoint",
    "ConfigError",
    "ContinuousFileEnumerator",
    "CrossDayRebuildError",
    "Discovery",
    "DiscoveryResult",
    "EnumeratorDiscovery",
    "FencedError",
    "FileChangedError",
    "FileDiscovery",
    "FileIdentity",
    "FileSplit",
    "LandingRoot",
    "LiveState",
    "Location",
    "ObjectLanding",
    "OutsideLandingError",
    "OutsidePrefixError",
    "PartitionBusyError",
    "PartitionCompletion",
    "Platform",
    "PlatformStatus",
    "QuarantinedSplit",
    "Rebuild",
    "RebuildStatus",
    "RebuildStore",
    "SchemaError",
    "Settings",
    "Split",
    "SplitAssignment",
    "SplitAssignmentTracker",
    "SplitEnumerator",
    "SplitState",
    "SplitStatus",
    "SplitStore",
    "StagedTransaction",
    "StaticFileEnumerator",
    "StorageError",
    "StorageOptions",
    "TableDiscovery",
    "TableRangeEnumerator",
    "TableRangeSplit",
    "TransactionalSink",
    "acknowledge",
    "asyncpg_dsn",
    "change_time",
    "check_unchanged",
    "check_uri",
    "child_path",
    "committed_task_watermark",
    "completed_partitions",
    "completions_table_exists",
    "connect_engine",
    "current_identity",
    "database_url",
    "days_with_files",
    "dead_letters",
    "discover",
    "embedded_state",
    "encode_dead_letters",
    "identity_now",
    "is_uri",
    "kind_of",
    "landing_days",
    "live_state",
    "load_settings",
    "mark_reported",
    "modification_time",
    "new_secret_file",
    "open_location",
    "open_platform",
    "partition_completions",
    "partition_date",
    "partition_rebuilds",
    "platform_status",
    "prune_finished_runs",
    "publish_committed",
    "qualified_name",
    "quarantined",
    "quote_identifier",
    "read_password_file",
    "recover",
    "redact_text",
    "redact_url",
    "relative_under",
    "require_current_schema",
    "retry_splits",
    "safe_name",
    "sink_transactions",
    "split_password",
    "splits",
    "stop_embedded",
    "sweep_secret_files",
    "unreported_completions",
    "upgrade_schema",
    "validate_identifier",
    "with_password",
]
