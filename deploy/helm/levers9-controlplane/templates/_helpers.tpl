{{/* Names and labels. */}}
{{- define "levers9.fullname" -}}
{{- if hasPrefix .Release.Name .Chart.Name -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "levers9.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "levers9.labels" -}}
{{ include "levers9.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "levers9.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "levers9.fullname" .) -}}
{{- else -}}
{{- .Values.serviceAccount.name | default "default" -}}
{{- end -}}
{{- end -}}

{{/*
The secret keys of `config`, and where they live. A pool's `kubernetes.credentials` (the
service account key) and the controlplane's temporalApiKey / workerTokenSecret / apiToken go to
the Secret; everything else to the ConfigMap. The controlplane merges the two files like
`helm -f a -f b`, so it sees the block as written.
*/}}
{{- define "levers9.secretSettings" -}}
{{- list "temporalApiKey" "workerTokenSecret" "apiToken" | toJson -}}
{{- end -}}

{{- define "levers9.controlplaneSettings" -}}
{{- (.Values.config | default dict).controlplane | default dict | toJson -}}
{{- end -}}

{{/* Whether the chart keeps the worker token secret (the values file gave none). */}}
{{- define "levers9.generatesTokenSecret" -}}
{{- $cp := include "levers9.controlplaneSettings" . | fromJson -}}
{{- if not (or (hasKey $cp "workerTokenSecret") (hasKey $cp "workerTokenSecretFile")) -}}true{{- end -}}
{{- end -}}

{{- define "levers9.publicConfig" -}}
{{- $config := .Values.config | default dict -}}
{{- $cp := include "levers9.controlplaneSettings" . | fromJson -}}
{{- $public := $cp -}}
{{- range include "levers9.secretSettings" . | fromJsonArray -}}
{{- $_ := unset $public . -}}
{{- end -}}
{{- $listen := printf "0.0.0.0:%v" .Values.gateway.port -}}
{{- if and (hasKey $public "gatewayListen") (not (hasSuffix (printf ":%v" .Values.gateway.port) $public.gatewayListen)) -}}
{{- fail (printf "config.controlplane.gatewayListen %s must listen on gateway.port (%v), which the Service and the container port use" $public.gatewayListen .Values.gateway.port) -}}
{{- end -}}
{{- $_ := set $public "gatewayListen" ($public.gatewayListen | default $listen) -}}
{{- if include "levers9.generatesTokenSecret" . -}}
{{- $_ := set $public "workerTokenSecretFile" "/etc/levers9/worker-token/secret" -}}
{{- end -}}
{{- if .Values.temporalTls.existingSecret -}}
{{- $_ := set $public "temporalTls" true -}}
{{- $_ := set $public "temporalTlsCertFile" "/etc/levers9/temporal-tls/tls.crt" -}}
{{- $_ := set $public "temporalTlsKeyFile" "/etc/levers9/temporal-tls/tls.key" -}}
{{- $_ := set $public "temporalTlsServerCaFile" "/etc/levers9/temporal-tls/ca.crt" -}}
{{- end -}}
{{- if include "levers9.gatewayTlsSecret" . -}}
{{- $_ := set $public "gatewayTls" true -}}
{{- $_ := set $public "gatewayTlsCertFile" "/etc/levers9/gateway-tls/tls.crt" -}}
{{- $_ := set $public "gatewayTlsKeyFile" "/etc/levers9/gateway-tls/tls.key" -}}
{{- $caKey := include "levers9.gatewayTlsCaKey" . -}}
{{- if $caKey -}}
{{- $_ := set $public "gatewayTlsCaFile" (printf "/etc/levers9/gateway-tls/%s" $caKey) -}}
{{- end -}}
{{- end -}}
{{- $pools := dict -}}
{{- range $name, $pool := (($config.worker | default dict).pools | default dict) -}}
{{- if and (kindIs "map" $pool) (kindIs "map" $pool.kubernetes) -}}
{{- $_ := set $pools $name (merge (dict "kubernetes" (omit $pool.kubernetes "credentials")) (omit $pool "kubernetes")) -}}
{{- else -}}
{{- $_ := set $pools $name $pool -}}
{{- end -}}
{{- end -}}
{{- $worker := merge (dict "pools" $pools) (omit ($config.worker | default dict) "pools") -}}
{{- $rest := omit $config "controlplane" "worker" -}}
{{- toYaml (dict "config" (merge (dict "controlplane" $public "worker" $worker) $rest)) -}}
{{- end -}}

{{- define "levers9.privateConfig" -}}
{{- $config := .Values.config | default dict -}}
{{- $cp := include "levers9.controlplaneSettings" . | fromJson -}}
{{- $private := dict -}}
{{- range include "levers9.secretSettings" . | fromJsonArray -}}
{{- if hasKey $cp . -}}
{{- $_ := set $private . (get $cp .) -}}
{{- end -}}
{{- end -}}
{{- $pools := dict -}}
{{- range $name, $pool := (($config.worker | default dict).pools | default dict) -}}
{{- if and (kindIs "map" $pool) (kindIs "map" $pool.kubernetes) (hasKey $pool.kubernetes "credentials") -}}
{{- $_ := set $pools $name (dict "kubernetes" (dict "credentials" $pool.kubernetes.credentials)) -}}
{{- end -}}
{{- end -}}
{{- toJson (dict "config" (dict "controlplane" $private "worker" (dict "pools" $pools))) -}}
{{- end -}}

{{/* The Secret the gateway serves TLS from: gatewayTls.existingSecret, else the chart's own
(cert-manager's when it is installed, else generated once); empty with gatewayTls.plaintext. */}}
{{- define "levers9.gatewayTlsSecret" -}}
{{- if .Values.gatewayTls.existingSecret -}}
{{- .Values.gatewayTls.existingSecret -}}
{{- else if not .Values.gatewayTls.plaintext -}}
{{- printf "%s-gateway-tls" (include "levers9.fullname" .) -}}
{{- end -}}
{{- end -}}

{{- define "levers9.gatewayTlsCaKey" -}}
{{- if .Values.gatewayTls.existingSecret -}}{{ .Values.gatewayTls.caKey }}{{- else -}}ca.crt{{- end -}}
{{- end -}}

{{/* The names the chart's own gateway certificate carries: the host of
config.controlplane.gatewayAdvertisedAddress (what workers and the CLI dial), and
gatewayTls.hosts; comma-separated. */}}
{{- define "levers9.gatewayHosts" -}}
{{- $cp := include "levers9.controlplaneSettings" . | fromJson -}}
{{- $hosts := list -}}
{{- with $cp.gatewayAdvertisedAddress -}}
{{- $hosts = append $hosts (regexReplaceAll "^\\[|\\]$" (regexReplaceAll ":[0-9]+$" . "") "") -}}
{{- end -}}
{{- range .Values.gatewayTls.hosts -}}
{{- $hosts = append $hosts . -}}
{{- end -}}
{{- $hosts | uniq | join "," -}}
{{- end -}}
