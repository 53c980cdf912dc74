"""The Google Cloud APIs the attach step calls, emulated for the sandbox's own project.

The sandbox serves them from the same process as its Kubernetes API, on a port of their own
(127.0.0.1, HTTPS with the sandbox's CA), and shares its state with that API: the cluster's
authorized networks and the project's service-account role bindings are the sandbox's
`AccessPolicy`, keys are its `Authenticator`'s, node pools its nodes. So updating the
authorized networks here changes whom the Kubernetes API admits, and binding
`roles/container.developer` to a new account here is what lets that account's key list pods.
The official clients reach it with `transport="rest"` and
`client_options={"api_endpoint": "https://127.0.0.1:<port>"}` (google-cloud-iam's
`iam_admin_v1` has no REST transport: gcloud or plain HTTPS for IAM); gcloud with
`env.cloud_env`.

Paths below start `/v1/projects/{p}` (`P`) or `/compute/v1/projects/{p}/global` (`G`);
`{l}` is a location, and the cluster paths also answer under `zones/{z}` for `locations/{l}`.

| method and path | does |
| - | - |
| `GET P/locations/{l}/clusters[/{c}]` | the cluster (`container`) |
| `PUT P/locations/{l}/clusters/{c}` | UpdateCluster: authorized networks; a DONE Operation |
| `GET P/locations/{l}/clusters/{c}/nodePools[/{np}]` | node pools, from the nodes' labels |
| `GET P/locations/{l}/operations/{op}` | a cluster's, or a repository's, operation |
| `GET, POST G/firewalls` | list, insert firewall rules (`compute`) |
| `GET, PATCH, PUT, DELETE G/firewalls/{name}` | one rule |
| `GET G/operations/{op}`, `POST G/operations/{op}/wait` | compute's operations (DONE) |
| `GET, POST P/serviceAccounts` | list, create service accounts (`iam`) |
| `GET, DELETE P/serviceAccounts/{email or id}` | one account (`{p}` may be `-`) |
| `GET, POST P/serviceAccounts/{a}/keys` | list, create keys (key file in `privateKeyData`) |
| `GET, DELETE P/serviceAccounts/{a}/keys/{id}` | one key |
| `POST /v1/projects/{p}:getIamPolicy`, `:setIamPolicy` | the IAM policy, with etag (`policy`) |
| `POST /v3/projects/{p}:getIamPolicy`, `:setIamPolicy` | the same, as resourcemanager_v3 |
| `GET /v1/projects/{p}`, `GET /v3/projects/{p}` | the project (id, number) |
| `GET, POST P/locations/{l}/repositories` | list, create (`?repositoryId=`) (`artifacts`) |
| `GET, DELETE P/locations/{l}/repositories/{id}` | one repository |
| `POST /token` | OAuth2 JWT-bearer exchange (the sandbox's token endpoint) |
| `GET /_gcp/state` | everything above, for tests and debugging (admin token) |
| `GET, POST, DELETE /_gcp/faults[/{id}]` | staged failures (`faults`; admin token) |

Every API call needs `Authorization: Bearer` with a token the sandbox issued or a JWT signed
by a key it knows (what Google's clients send); the caller's roles on the project decide
(`roles`). A project number works wherever the project id does.

Modules: `server` (the gate and admin routes), `container`, `compute`, `iam`, `policy`,
`artifacts` (one API each), `world` (what the project holds, kept across restarts), `roles`,
`errors` (Google's error bodies), `faults`, `env` (`cloud_env` for gcloud and clients).
"""
