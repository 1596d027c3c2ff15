"""Envs in another process over OpenEnv's HTTP protocol: the protocol's types
(``protocol``), the server (``python -m ragen_envs.remote.serve``) and the training
side's client (``client``, whose names this package also gives, as the flat
``ragen_envs.remote`` module of earlier releases did)."""

from ragen_envs.remote.client import (
    SCHEMES,
    OpenEnvTextEnv,
    RemoteEnvError,
    base_url_of,
    check_server,
    is_remote_id,
)

__all__ = [
    "SCHEMES",
    "OpenEnvTextEnv",
    "RemoteEnvError",
    "base_url_of",
    "check_server",
    "is_remote_id",
]
