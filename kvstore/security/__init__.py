"""kvstore's trust boundary: who may call what, and what hostile input gets.

    config.py       SecurityConfig: mode (insecure | tls | token) and the credential files,
                    from code, a [security] TOML section or KVSTORE_SECURITY_* variables
    certs.py        a small local CA (`kvstore certs init | issue | token | show`)
    tokens.py       HMAC tokens binding (role, id, tenant, expiry) for one-host pools
    identity.py     Identity (role, id, tenant) read from a peer certificate or a token
    credentials.py  grpc server/channel credentials of a SecurityConfig
    interceptor.py  every server's authentication (and malformed protobuf -> INVALID_ARGUMENT)
    authz.py        the master's authorization rules, one table, per RPC
    tenants.py      tenant scoping of keys and the per-tenant quota ledger
    limits.py       sizes and counts the master accepts (lengths, batches, replies, memory)
    guard.py        the master's interceptor: limits, then authz and tenants, per call
    capabilities.py data-plane grants: the master's per-node keys and MACs over (segment,
                    range, mode, expiry, node), checked by nodes with no round trip

Threat model, roles and the guarantees with their tests: docs/security.md.
"""
