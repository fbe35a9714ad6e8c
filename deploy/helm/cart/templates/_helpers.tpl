{{/* Names. */}}
{{- define "cart.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's full name; component names append -cp, -dataplane, ...
so it is cut to leave room within the 63-character DNS label limit. */}}
{{- define "cart.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "cart.cpName" -}}{{ include "cart.fullname" . }}-cp{{- end }}
{{/* Headless: stable per-pod DNS names for Raft and the API. */}}
{{- define "cart.cpHeadless" -}}{{ include "cart.fullname" . }}-cp-headless{{- end }}
{{- define "cart.dpName" -}}{{ include "cart.fullname" . }}-dataplane{{- end }}
{{- define "cart.eppName" -}}{{ include "cart.fullname" . }}-epp{{- end }}
{{/* The InferencePool the endpoint pickers serve. */}}
{{- define "cart.poolName" -}}{{ default (include "cart.fullname" .) .Values.endpointPicker.inferencePool.name }}{{- end }}

{{- define "cart.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "cart.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "cart.selectorLabels" -}}
app.kubernetes.io/name: {{ include "cart.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "cart.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "cart.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The control plane's ServiceAccount under Kubernetes discovery. */}}
{{- define "cart.discoverySA" -}}{{ include "cart.fullname" . }}-discovery{{- end }}

{{/* Whether the control plane discovers workers through the Kubernetes
API: discovery.kubernetes, or the endpoint pickers' InferencePool. */}}
{{- define "cart.discoveryOn" -}}
{{- if or .Values.discovery.kubernetes.enabled .Values.endpointPicker.enabled }}true{{ end }}
{{- end }}

{{/* Kubernetes discovery in cart config form (control plane only). With
the endpoint pickers, the workers are the InferencePool's pods. */}}
{{- define "cart.discoveryConfig" -}}
{{- $k := .Values.discovery.kubernetes }}
{{- $out := dict }}
{{- if .Values.endpointPicker.enabled }}
{{- if $k.enabled }}{{ fail "endpointPicker.enabled discovers the InferencePool's pods: leave discovery.kubernetes disabled" }}{{ end }}
{{- $out = dict "discovery" (dict "kubernetes" (dict "enabled" true "namespace" .Release.Namespace "inference_pool" (include "cart.poolName" .))) }}
{{- else if $k.enabled }}
{{- $kc := dict "enabled" true "namespace" (default .Release.Namespace $k.namespace) "port" (toString $k.port) }}
{{- with $k.service }}{{ $_ := set $kc "service" . }}{{ end }}
{{- with $k.selector }}{{ $_ := set $kc "selector" . }}{{ end }}
{{- $out = dict "discovery" (dict "kubernetes" $kc) }}
{{- end }}
{{- toYaml $out }}
{{- end }}

{{- define "cart.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "cart.authSecretName" -}}
{{- default (printf "%s-auth" (include "cart.fullname" .)) .Values.auth.existingSecret }}
{{- end }}

{{/* Where pods mount their credentials (the configs' auth.*_file): each
pod gets only the ones its role uses, see cart.tokenVolume. */}}
{{- define "cart.tokenDir" -}}/var/run/secrets/cart{{- end }}
{{- define "cart.tokenFile" -}}{{ include "cart.tokenDir" . }}/token{{- end }}
{{- define "cart.adminTokenFile" -}}{{ include "cart.tokenDir" . }}/admin-token{{- end }}
{{- define "cart.clientKeyFile" -}}{{ include "cart.tokenDir" . }}/client-key{{- end }}
{{- define "cart.raftTokenFile" -}}{{ include "cart.tokenDir" . }}/raft-token{{- end }}

{{/* The control plane's in-cluster API URL: a ClusterIP Service over Ready
(leader-aware) nodes, for cartctl and the init containers. */}}
{{- define "cart.cpURL" -}}
http://{{ include "cart.cpName" . }}.{{ .Release.Namespace }}.svc.{{ .Values.clusterDomain }}:6701
{{- end }}

{{/* DNS name of control-plane pod number .i (dict "root" $ "i" N). */}}
{{- define "cart.cpPodHost" -}}
{{- $root := .root -}}
{{ include "cart.cpName" $root }}-{{ .i }}.{{ include "cart.cpHeadless" $root }}.{{ $root.Release.Namespace }}.svc.{{ $root.Values.clusterDomain }}
{{- end }}

{{/* The cart-sim StatefulSet (and headless Service) of a role:
(dict "root" $ "role" role). */}}
{{- define "cart.simName" -}}{{ include "cart.fullname" .root }}-sim-{{ .role }}{{- end }}

{{/* Every worker the chart registers, in values form: .Values.workers,
then one per cart-sim pod (sims.replicas), with its role. */}}
{{- define "cart.allWorkers" -}}
{{- $out := list }}
{{- range .Values.workers }}
{{- $out = append $out . }}
{{- end }}
{{- range $role := list "both" "prefill" "decode" }}
{{- $name := include "cart.simName" (dict "root" $ "role" $role) }}
{{- range $i := until (int (index $.Values.sims.replicas $role)) }}
{{- $out = append $out (dict "url" (printf "http://%s-%d.%s.%s.svc.%s:8000" $name $i $name $.Release.Namespace $.Values.clusterDomain) "role" $role) }}
{{- end }}
{{- end }}
{{- toYaml (dict "workers" $out) }}
{{- end }}

{{/* Workers in cart config form. */}}
{{- define "cart.workersConfig" -}}
{{- $out := list }}
{{- range (include "cart.allWorkers" . | fromYaml).workers }}
{{- $w := dict "url" (required "every workers[] entry needs a url" .url) }}
{{- with .maxLoad }}{{ $_ := set $w "max_load" . }}{{ end }}
{{- with .loadPenalty }}{{ $_ := set $w "load_penalty" . }}{{ end }}
{{- with .cacheCapacityTokens }}{{ $_ := set $w "cache_capacity_tokens" . }}{{ end }}
{{- with .role }}{{ $_ := set $w "role" . }}{{ end }}
{{- $out = append $out $w }}
{{- end }}
{{- toYaml (dict "workers" $out) }}
{{- end }}

{{/* Settings every role shares and the chart owns: the token file and the
open-files threshold (the entrypoint's CART_MIN_OPEN_FILES matches). */}}
{{- define "cart.commonFixed" -}}
auth:
  token_file: {{ include "cart.tokenFile" . }}
server:
  min_open_files: {{ int .Values.minOpenFiles }}
{{- end }}

{{/* controlplane.yaml; (dict "root" $ "workers" bool). Without workers
it is the input of the pods' config checksum: the worker list only seeds a
new cluster, and changing it must not restart the control plane. */}}
{{- define "cart.cpConfig" -}}
{{- $root := .root }}
{{- $fixed := include "cart.commonFixed" $root | fromYaml }}
{{- $auth := dict "admin_token_file" (include "cart.adminTokenFile" $root) "raft_token_file" (include "cart.raftTokenFile" $root) }}
{{- if $root.Values.auth.raftAcceptClusterToken }}{{ $_ := set $auth "raft_accept_cluster_token" true }}{{ end }}
{{- $cp := dict "controlplane" (dict "api_addr" "0.0.0.0:6701" "raft_addr" "0.0.0.0:6702" "data_dir" "/var/lib/cart") "auth" $auth }}
{{- $cfg := mustMergeOverwrite (dict) (deepCopy $root.Values.config) (deepCopy $root.Values.controlPlane.config) $fixed $cp (include "cart.discoveryConfig" $root | fromYaml) }}
{{- if .workers }}
{{- $cfg = mustMergeOverwrite $cfg (include "cart.workersConfig" $root | fromYaml) }}
{{- end }}
{{- toYaml $cfg }}
{{- end }}

{{/* The per-node overlay of pod number .i: identity, advertised names,
bootstrap on node 0 (while controlPlane.bootstrap) and join through the
others. */}}
{{- define "cart.cpNodeConfig" -}}
{{- $root := .root }}
{{- $i := int .i }}
{{- $host := include "cart.cpPodHost" (dict "root" $root "i" $i) }}
{{- $node := dict "node_id" (printf "%s-%d" (include "cart.cpName" $root) $i) "advertise_raft_addr" (printf "%s:6702" $host) "advertise_api_url" (printf "http://%s:6701" $host) }}
{{- if and (eq $i 0) $root.Values.controlPlane.bootstrap }}
{{- $_ := set $node "bootstrap" true }}
{{- else }}
{{- $join := list }}
{{- range $j := until (int $root.Values.controlPlane.replicas) }}
{{- if ne $j $i }}
{{- $join = append $join (printf "http://%s:6701" (include "cart.cpPodHost" (dict "root" $root "i" $j))) }}
{{- end }}
{{- end }}
{{- $_ := set $node "join" $join }}
{{- end }}
{{- toYaml (dict "controlplane" $node) }}
{{- end }}

{{/* dataplane.yaml; (dict "root" $ "workers" bool) as for cart.cpConfig. */}}
{{- define "cart.dpConfig" -}}
{{- $root := .root }}
{{- $fixed := include "cart.commonFixed" $root | fromYaml }}
{{- $cps := list }}
{{- range $i := until (int $root.Values.controlPlane.replicas) }}
{{- $cps = append $cps (printf "http://%s:6701" (include "cart.cpPodHost" (dict "root" $root "i" $i))) }}
{{- end }}
{{- /* Tenants added in dataPlane.config (key files you mount) keep their
place; the chart's own key is appended, since lists are replaced on merge. */}}
{{- $keys := list }}
{{- with $root.Values.dataPlane.config.auth }}{{ with .client_keys }}{{ $keys = . }}{{ end }}{{ end }}
{{- $keys = append $keys (dict "name" $root.Values.auth.clientKeyName "key_file" (include "cart.clientKeyFile" $root)) }}
{{- $dp := dict "server" (dict "host" "0.0.0.0" "port" 6700) "dataplane" (dict "control_plane" $cps) "auth" (dict "client_keys" $keys) }}
{{- $cfg := mustMergeOverwrite (dict) (deepCopy $root.Values.config) (deepCopy $root.Values.dataPlane.config) $fixed $dp }}
{{- if .workers }}
{{- $cfg = mustMergeOverwrite $cfg (include "cart.workersConfig" $root | fromYaml) }}
{{- end }}
{{- toYaml $cfg }}
{{- end }}

{{/* epp.yaml: an endpoint picker asking the control plane, ext_proc on
endpointPicker.port, /metrics on endpointPicker.metricsPort. */}}
{{- define "cart.eppConfig" -}}
{{- $root := . }}
{{- $e := .Values.endpointPicker }}
{{- $fixed := include "cart.commonFixed" $root | fromYaml }}
{{- $cps := list }}
{{- range $i := until (int $root.Values.controlPlane.replicas) }}
{{- $cps = append $cps (printf "http://%s:6701" (include "cart.cpPodHost" (dict "root" $root "i" $i))) }}
{{- end }}
{{- $server := dict "host" "0.0.0.0" "port" (int $e.port) "metrics_addr" (printf "0.0.0.0:%d" (int $e.metricsPort)) }}
{{- $epp := dict "server" $server "dataplane" (dict "control_plane" $cps) "epp" (dict "fallback_endpoints" (int $e.fallbackEndpoints)) }}
{{- if $e.allowUnauthenticatedGateways }}
{{- $_ := set $epp "auth" (dict "allow_unauthenticated_remote" true) }}
{{- end }}
{{- toYaml (mustMergeOverwrite (dict) (deepCopy $root.Values.config) (deepCopy $e.config) $fixed $epp) }}
{{- end }}

{{/* The credentials volume of a pod: (dict "root" $ "keys" (list ...)),
keys among "token", "admin-token", "client-key" and "raft-token", so a pod
holds only what its role uses (a data plane never the admin or Raft token). */}}
{{- define "cart.tokenVolume" -}}
{{- $a := .root.Values.auth }}
{{- $src := dict "token" $a.secretKey "admin-token" $a.adminSecretKey "client-key" $a.clientKeySecretKey "raft-token" $a.raftSecretKey }}
- name: {{ .name | default "token" }}
  secret:
    secretName: {{ include "cart.authSecretName" .root }}
    defaultMode: 0440
    items:
      {{- range .keys }}
      - key: {{ index $src . }}
        path: {{ . }}
      {{- end }}
{{- end }}

{{- define "cart.tokenMount" -}}
- name: token
  mountPath: {{ include "cart.tokenDir" . }}
  readOnly: true
{{- end }}

{{/* A cartctl / cart-probe container's environment. */}}
{{- define "cart.cartctlEnv" -}}
- name: CARTCTL_SERVER
  value: {{ include "cart.cpURL" . | quote }}
- name: CARTCTL_TOKEN_FILE
  value: {{ include "cart.adminTokenFile" . | quote }}
# The chart's control-plane API is plain HTTP on the pod network, and
# cartctl refuses to send a token over plain http to anything but loopback
# unless told: here it is told, since pod-to-pod is the deployment's trust
# boundary (restrict it with NetworkPolicies).
- name: CARTCTL_INSECURE
  value: "true"
{{- end }}
