"""The values block: `config.worker.pools.<name>` as pydantic models, loaded like `helm -f`.

Values files (YAML or JSON) merge in order, maps deeply, later wins, `null` deletes a key, so
the spec's private credentials file merges into the pool block it completes. A pool that does
not validate is not loaded; the others are (a controlplane with one broken pool still serves
the rest). Every error names its field path, e.g.
`config.worker.pools.gke-rtx6000.kubernetes.caCertificate: not a base64 PEM certificate`.

Secrets (`credentials`, the worker token secret) are `SecretStr`: they never appear in a repr,
a dump, a log line or an error message (`hide_input_in_errors`).

No I/O at import time; `load_values` and `credentialsFile` read files when called.

The package holds, one module each: `pool` (per-pool settings), `pool_values` (the one typed
builder of a pool's block: `gke attach`'s, a join's, the dev stack's), `settings` (the
controlplane's), `loading` (reading and merging files), `values` (the schema of the merged
document: pools, problems, settings) and `errors`. Import from `levers9.config`: the names
below are its face.
"""

from __future__ import annotations

from levers9.config.errors import ConfigError, describe_validation_error
from levers9.config.loading import (
    MAX_DEPTH,
    DuplicateKey,
    load_values,
    merge_values,
    read_values_file,
)
from levers9.config.pool import (
    PROVIDER,
    CacheConfig,
    KubernetesConfig,
    PoolConfig,
    Quantity,
    TaskDefaults,
    WorkerResources,
)
from levers9.config.pool_values import as_values, pool_values
from levers9.config.settings import ControlplaneSettings
from levers9.config.values import (
    CONTROLPLANE_PATH,
    INVALID_PROVIDER,
    KNOWN_ABOVE_POOLS,
    POOLS_PATH,
    PoolProblem,
    Values,
    joined_pool,
    load,
    parse_pool,
    parse_settings,
    parse_values,
)

__all__ = [
    "CONTROLPLANE_PATH",
    "INVALID_PROVIDER",
    "KNOWN_ABOVE_POOLS",
    "MAX_DEPTH",
    "POOLS_PATH",
    "PROVIDER",
    "CacheConfig",
    "ConfigError",
    "ControlplaneSettings",
    "DuplicateKey",
    "KubernetesConfig",
    "PoolConfig",
    "PoolProblem",
    "Quantity",
    "TaskDefaults",
    "Values",
    "WorkerResources",
    "as_values",
    "describe_validation_error",
    "joined_pool",
    "load",
    "load_values",
    "merge_values",
    "parse_pool",
    "parse_settings",
    "parse_values",
    "pool_values",
    "read_values_file",
]
