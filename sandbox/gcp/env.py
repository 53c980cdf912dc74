"""The environment that points real Google Cloud tools at a running sandbox's GCP APIs.

    env = cloud_env(Path(".levers9/dev/sandbox"))
    subprocess.run(["gcloud", "container", "clusters", "describe", "demo",
                    "--zone", "us-central1-a"], env={**os.environ, **env})

| variable | value | for |
| - | - | - |
| `LEVERS9_GCP_ENDPOINT` | `https://127.0.0.1:<port>` | python clients' `api_endpoint` |
| `LEVERS9_GCP_CA_FILE` | `<state>/ca.crt` | what python clients must trust (not set globally) |
| `GOOGLE_APPLICATION_CREDENTIALS` | `<state>/operator-key.json` | `google.auth.default()` |
| `GOOGLE_CLOUD_PROJECT`, `CLOUDSDK_CORE_PROJECT` | the scenario's project | both |
| `CLOUDSDK_API_ENDPOINT_OVERRIDES_<API>` | `https://127.0.0.1:<port>/` | gcloud (1) |
| `CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE` | `https://127.0.0.1:<port>/compute/v1/` | gcloud |
| `CLOUDSDK_CORE_CUSTOM_CA_CERTS_FILE` | `<state>/ca.crt` | gcloud's TLS |
| `REQUESTS_CA_BUNDLE` | `<state>/ca-bundle.pem`: public CAs and the sandbox's | both (2) |
| `CLOUDSDK_AUTH_CREDENTIAL_FILE_OVERRIDE` | the operator key | gcloud signs in as the operator |
| `CLOUDSDK_AUTH_TOKEN_HOST` | `https://127.0.0.1:<port>/token` | where gcloud exchanges the key |
| `CLOUDSDK_CONFIG` | `<state>/gcloud` | gcloud's config and logs; `~/.config` untouched |

(1) for `<API>` = `CONTAINER`, `IAM`, `CLOUDRESOURCEMANAGER`, `ARTIFACTREGISTRY`;
(2) requests lets `REQUESTS_CA_BUNDLE` override the CA file a session was given, so gcloud
ignores its custom CA whenever that variable is set (as on many machines); a bundle that holds
both keeps gcloud and every python client (REST transports use requests) working, for Google's
own hosts too;
and switches that keep gcloud on loopback and quiet (no usage reporting, update checks,
surveys, prompts, or GCE metadata probe). gcloud joins an override with its API's base path
only when the override has no path of its own, so compute's carries `/compute/v1/` and the
others `/` (their versions are in each request's path).
"""

from __future__ import annotations

import json
from pathlib import Path

OPERATOR_KEY = "operator-key.json"
_ROOT_OVERRIDES = ("CONTAINER", "IAM", "CLOUDRESOURCEMANAGER", "ARTIFACTREGISTRY")


class CloudEnvUnavailable(Exception):
    """The state directory has no GCP APIs recorded (no sandbox ran there, or an old one)."""


def cloud_env(sandbox_state_dir: Path) -> dict[str, str]:
    """The variables for a sandbox whose state is in `sandbox_state_dir` (it need not run
    yet to build them, only to answer); CloudEnvUnavailable if it never started there."""
    state = sandbox_state_dir.absolute()
    try:
        info = json.loads((state / "sandbox.json").read_text())
        url, project = str(info["gcpUrl"]), str(info["project"])
    except (OSError, ValueError, KeyError):
        raise CloudEnvUnavailable(
            f"no sandbox GCP APIs recorded in {state / 'sandbox.json'}: start the sandbox "
            "(`levers9 dev up` or `levers9 sandbox serve`)"
        ) from None
    key, ca = str(state / OPERATOR_KEY), str(state / "ca.crt")
    env = {
        "LEVERS9_GCP_ENDPOINT": url,
        "LEVERS9_GCP_CA_FILE": ca,
        "REQUESTS_CA_BUNDLE": str(state / "ca-bundle.pem"),
        "GOOGLE_APPLICATION_CREDENTIALS": key,
        "GOOGLE_CLOUD_PROJECT": project,
        "CLOUDSDK_CORE_PROJECT": project,
        "CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE": f"{url}/compute/v1/",
        "CLOUDSDK_CORE_CUSTOM_CA_CERTS_FILE": ca,
        "CLOUDSDK_AUTH_CREDENTIAL_FILE_OVERRIDE": key,
        "CLOUDSDK_AUTH_TOKEN_HOST": f"{url}/token",
        "CLOUDSDK_CONFIG": str(state / "gcloud"),
        "CLOUDSDK_CORE_DISABLE_USAGE_REPORTING": "true",
        "CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK": "true",
        "CLOUDSDK_SURVEY_DISABLE_PROMPTS": "true",
        "CLOUDSDK_CORE_DISABLE_PROMPTS": "true",
        "CLOUDSDK_CORE_CHECK_GCE_METADATA": "false",
    }
    for api in _ROOT_OVERRIDES:
        env[f"CLOUDSDK_API_ENDPOINT_OVERRIDES_{api}"] = f"{url}/"
    return env
