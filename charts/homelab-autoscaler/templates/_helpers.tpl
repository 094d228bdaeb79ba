{{/*
Pieces shared by the templates. Names are fixed (not derived from the release): cluster-autoscaler's cloud-config,
the certificates' DNS names and the webhook's exemption of the operator's own writes refer to them.
*/}}

{{/* The labels of every object: its component's name (.name, when it has one), the install it is part of, the
user's own. */}}
{{- define "homelab-autoscaler.labels" -}}
{{- with .name }}
app.kubernetes.io/name: {{ . }}
{{- end }}
app.kubernetes.io/part-of: homelab-autoscaler
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* An object's metadata: .objectName, the release's namespace unless .clusterScoped, its labels and .labels. */}}
{{- define "homelab-autoscaler.metadata" -}}
metadata:
  name: {{ .objectName }}
  {{- if not .clusterScoped }}
  namespace: {{ .root.Release.Namespace }}
  {{- end }}
  labels:
    {{- include "homelab-autoscaler.labels" . | nindent 4 }}
    {{- with .labels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end }}

{{- define "homelab-autoscaler.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The operator's ServiceAccount as the API server names it in a request (the webhook spares its writes). */}}
{{- define "homelab-autoscaler.operatorUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:homelab-autoscaler
{{- end }}

{{/* The Temporal frontend: the bundled dev server's Service, or the address given. */}}
{{- define "homelab-autoscaler.temporalAddress" -}}
{{- if .Values.temporal.devServer.enabled -}}
temporal-frontend:7233
{{- else -}}
{{- required "temporal.address: the frontend (host:port) of an existing Temporal is required when temporal.devServer.enabled is false" .Values.temporal.address -}}
{{- end -}}
{{- end }}

{{/* The namespaces the operator manages, when they are not its built-in default (homelab-autoscaler-system). */}}
{{- define "homelab-autoscaler.namespaces" -}}
{{- $names := .Values.operator.namespaces | default (list .Release.Namespace) -}}
{{- if ne (join "," $names) "homelab-autoscaler-system" -}}
{{ join "," $names }}
{{- end -}}
{{- end }}

{{/* Refusals no schema can say: a combination of values. */}}
{{- define "homelab-autoscaler.checks" -}}
{{- if and .Values.admission.enabled (not .Values.certManager.enabled) -}}
{{- fail "admission.enabled: the webhook's certificate comes from the CA of certManager; set certManager.enabled too" -}}
{{- end -}}
{{- if and .Values.temporal.devServer.enabled .Values.temporal.address -}}
{{- fail (printf "temporal.address (%s) is for an existing Temporal: set temporal.devServer.enabled=false, or leave the address empty" .Values.temporal.address) -}}
{{- end -}}
{{- end }}

{{/*
The env of an operator container of role .role (run, worker, provider, watch): the Temporal client, then what the
role serves. Every name is a setting of that role's command (tests/test_chart.py checks each against the CLI).
*/}}
{{- define "homelab-autoscaler.env" -}}
{{- $v := .root.Values -}}
{{- $role := .role -}}
- name: HOMELAB_AUTOSCALER_TEMPORAL_ADDRESS
  value: {{ include "homelab-autoscaler.temporalAddress" .root | quote }}
- name: HOMELAB_AUTOSCALER_TEMPORAL_NAMESPACE
  value: {{ $v.temporal.namespace | quote }}
{{- if $v.temporal.tls.secretName }}
- name: HOMELAB_AUTOSCALER_TEMPORAL_TLS_CERT
  value: /etc/temporal-tls/tls.crt
- name: HOMELAB_AUTOSCALER_TEMPORAL_TLS_KEY
  value: /etc/temporal-tls/tls.key
- name: HOMELAB_AUTOSCALER_TEMPORAL_TLS_CA
  value: /etc/temporal-tls/ca.crt
{{- end }}
{{- with $v.temporal.tls.serverName }}
- name: HOMELAB_AUTOSCALER_TEMPORAL_TLS_SERVER_NAME
  value: {{ . | quote }}
{{- end }}
{{- if $v.temporal.apiKey.secretName }}
- name: HOMELAB_AUTOSCALER_TEMPORAL_API_KEY
  valueFrom:
    secretKeyRef:
      name: {{ $v.temporal.apiKey.secretName }}
      key: {{ $v.temporal.apiKey.key }}
{{- end }}
- name: HOMELAB_AUTOSCALER_LOG_LEVEL
  value: {{ $v.operator.logLevel | quote }}
# Prometheus /metrics for a scrape from outside the pod.
- name: HOMELAB_AUTOSCALER_METRICS_ADDRESS
  value: 0.0.0.0:9464
{{- if has $role (list "run" "provider" "watch") }}
{{- with include "homelab-autoscaler.namespaces" .root }}
- name: HOMELAB_AUTOSCALER_NAMESPACES
  value: {{ . | quote }}
{{- end }}
{{- end }}
{{- if has $role (list "run" "provider") }}
# cluster-autoscaler reaches the provider through its Service, so it listens on every interface; plaintext is then
# refused unless allowed: with certManager.enabled it requires a client certificate from the namespace CA.
- name: HOMELAB_AUTOSCALER_PROVIDER_ADDRESS
  value: 0.0.0.0:8086
{{- if $v.certManager.enabled }}
- name: HOMELAB_AUTOSCALER_INSECURE
  value: "false"
- name: HOMELAB_AUTOSCALER_TLS_CERT
  value: /etc/homelab-autoscaler/tls/tls.crt
- name: HOMELAB_AUTOSCALER_TLS_KEY
  value: /etc/homelab-autoscaler/tls/tls.key
- name: HOMELAB_AUTOSCALER_TLS_CA
  value: /etc/homelab-autoscaler/tls/ca.crt
{{- else }}
- name: HOMELAB_AUTOSCALER_INSECURE
  value: "true"
{{- end }}
{{- if $v.admission.enabled }}
- name: HOMELAB_AUTOSCALER_WEBHOOK_ADDRESS
  value: 0.0.0.0:9443
- name: HOMELAB_AUTOSCALER_WEBHOOK_TLS_CERT
  value: /etc/homelab-autoscaler/webhook-tls/tls.crt
- name: HOMELAB_AUTOSCALER_WEBHOOK_TLS_KEY
  value: /etc/homelab-autoscaler/webhook-tls/tls.key
{{- end }}
{{- end }}
{{- if has $role (list "run" "watch") }}
# The kubelet probes the pod IP, not the loopback.
- name: HOMELAB_AUTOSCALER_HEALTH_HOST
  value: 0.0.0.0
- name: HOMELAB_AUTOSCALER_HEALTH_PORT
  value: "8081"
- name: HOMELAB_AUTOSCALER_LEASE_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: HOMELAB_AUTOSCALER_IDENTITY
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
{{- end }}
{{- with $v.operator.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The ports of an operator container of role .role. */}}
{{- define "homelab-autoscaler.ports" -}}
{{- if has .role (list "run" "provider") }}
- name: grpc
  containerPort: 8086
{{- end }}
{{- if and .root.Values.admission.enabled (has .role (list "run" "provider")) }}
- name: webhook
  containerPort: 9443
{{- end }}
{{- if has .role (list "run" "watch") }}
- name: health
  containerPort: 8081
{{- end }}
- name: metrics
  containerPort: 9464
{{- end }}

{{/* The volumes (.part = "volumes") or mounts (.part = "mounts") of an operator container of role .role. */}}
{{- define "homelab-autoscaler.volumes" -}}
{{- $v := .root.Values -}}
{{- $serves := has .role (list "run" "provider") -}}
{{- if eq .part "mounts" }}
- name: tmp
  mountPath: /tmp
{{- if $v.temporal.tls.secretName }}
- name: temporal-tls
  mountPath: /etc/temporal-tls
  readOnly: true
{{- end }}
{{- if and $serves $v.certManager.enabled }}
- name: provider-tls
  mountPath: /etc/homelab-autoscaler/tls
  readOnly: true
{{- end }}
{{- if and $serves $v.admission.enabled }}
- name: webhook-tls
  mountPath: /etc/homelab-autoscaler/webhook-tls
  readOnly: true
{{- end }}
{{- else }}
- name: tmp
  emptyDir: {}
{{- if $v.temporal.tls.secretName }}
- name: temporal-tls
  secret:
    secretName: {{ $v.temporal.tls.secretName }}
{{- end }}
{{- if and $serves $v.certManager.enabled }}
# Re-read when the provider restarts; cert-manager renews 15 days before expiry.
- name: provider-tls
  secret:
    secretName: homelab-autoscaler-provider-tls
{{- end }}
{{- if and $serves $v.admission.enabled }}
# Re-read when renewed; no restart needed.
- name: webhook-tls
  secret:
    secretName: homelab-autoscaler-webhook-tls
{{- end }}
{{- end }}
{{- end }}

{{/* The Pod's security context: the image's non-root user, the runtime's seccomp profile. */}}
{{- define "homelab-autoscaler.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
{{- with .fsGroup }}
fsGroup: {{ . }}
{{- end }}
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* A container's security context: nothing gained, nothing written but its volumes. */}}
{{- define "homelab-autoscaler.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
{{- end }}

{{/* Where a Pod runs, and what it pulls with: .placement holds nodeSelector, affinity, tolerations. */}}
{{- define "homelab-autoscaler.scheduling" -}}
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .placement.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .placement.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .placement.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
One operator Deployment: .role is the subcommand, .name the Deployment's name, .component its component label,
.replicas, .strategy (optional), .probes the container's probes as YAML.
*/}}
{{- define "homelab-autoscaler.deployment" -}}
{{- $v := .root.Values -}}
{{- $selector := dict "app.kubernetes.io/name" "homelab-autoscaler" "app.kubernetes.io/component" .component -}}
{{- $serves := has .role (list "run" "provider") -}}
{{- $labels := dict "app.kubernetes.io/component" .component -}}
{{- if $serves }}{{ $_ := set $labels "homelab-autoscaler.dev/provider" "true" }}{{ end -}}
apiVersion: apps/v1
kind: Deployment
{{ include "homelab-autoscaler.metadata" (dict "root" .root "name" "homelab-autoscaler" "objectName" .name "labels" $labels) }}
spec:
  replicas: {{ .replicas }}
  {{- with .strategy }}
  strategy:
    type: {{ . }}
  {{- end }}
  selector:
    matchLabels:
      {{- toYaml $selector | nindent 6 }}
  template:
    metadata:
      labels:
        {{- toYaml $selector | nindent 8 }}
        {{- if and $serves $v.admission.enabled }}
        # What the webhook's Service selects.
        homelab-autoscaler.dev/admission: "true"
        {{- end }}
      {{- with $v.operator.podAnnotations }}
      annotations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
    spec:
      serviceAccountName: homelab-autoscaler
      securityContext:
        {{- include "homelab-autoscaler.podSecurityContext" (dict) | nindent 8 }}
      {{- include "homelab-autoscaler.scheduling" (dict "root" .root "placement" $v.operator) | nindent 6 }}
      containers:
        - name: homelab-autoscaler
          image: {{ include "homelab-autoscaler.image" .root }}
          {{- with $v.image.pullPolicy }}
          imagePullPolicy: {{ . }}
          {{- end }}
          args: [{{ .role | quote }}]
          env:
            {{- include "homelab-autoscaler.env" . | nindent 12 }}
          ports:
            {{- include "homelab-autoscaler.ports" . | nindent 12 }}
          {{- with .probes }}
          {{- . | nindent 10 }}
          {{- end }}
          resources:
            {{- toYaml $v.operator.resources | nindent 12 }}
          securityContext:
            {{- include "homelab-autoscaler.containerSecurityContext" . | nindent 12 }}
          volumeMounts:
            {{- include "homelab-autoscaler.volumes" (dict "root" .root "role" .role "part" "mounts") | nindent 12 }}
      volumes:
        {{- include "homelab-autoscaler.volumes" (dict "root" .root "role" .role "part" "volumes") | nindent 8 }}
{{- end }}
