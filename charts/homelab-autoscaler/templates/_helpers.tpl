{{/*
Pieces shared by the templates. Names are fixed (not derived from the release): cluster-autoscaler's cloud-config,
the certificates' DNS names and the webhook's exemption of the operator's own writes refer to them.
*/}}

{{/* The labels of every object: its component's name (.name, when it has one), the install it is part of, the
development-only mark of an install with the dev server (as deploy/overlays/dev-server's), the user's own. */}}
{{- define "homelab-autoscaler.labels" -}}
{{- with .name }}
app.kubernetes.io/name: {{ . }}
{{- end }}
app.kubernetes.io/part-of: homelab-autoscaler
{{- if .root.Values.temporal.devServer.enabled }}
homelab-autoscaler.dev/development-only: "true"
{{- end }}
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* An object's metadata: .objectName, .namespace (the release's when empty) unless .clusterScoped, its labels and
.labels. */}}
{{- define "homelab-autoscaler.metadata" -}}
metadata:
  name: {{ .objectName }}
  {{- if not .clusterScoped }}
  namespace: {{ .namespace | default .root.Release.Namespace }}
  {{- end }}
  labels:
    {{- include "homelab-autoscaler.labels" . | nindent 4 }}
    {{- with .labels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end }}

{{- define "homelab-autoscaler.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end }}

{{/* The operator's ServiceAccount as the API server names it in a request (the webhook spares its writes). */}}
{{- define "homelab-autoscaler.operatorUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:homelab-autoscaler
{{- end }}

{{/* The Temporal frontend: the bundled server's Service (or the dev server's), or the address given. */}}
{{- define "homelab-autoscaler.temporalAddress" -}}
{{- if or .Values.temporal.bundled.enabled .Values.temporal.devServer.enabled -}}
temporal-frontend:7233
{{- else -}}
{{- required "temporal.address: the frontend (host:port) of an existing Temporal is required when neither temporal.bundled.enabled nor temporal.devServer.enabled is true" .Values.temporal.address -}}
{{- end -}}
{{- end }}

{{/* An image of the bundled Temporal by its key under temporal.bundled.images (.key). */}}
{{- define "homelab-autoscaler.temporalImage" -}}
{{- $image := index .root.Values.temporal.bundled.images .key -}}
{{ $image.repository }}:{{ $image.tag }}
{{- end }}

{{/* The namespaces the operator manages, when they are not its built-in default (homelab-autoscaler-system). */}}
{{- define "homelab-autoscaler.namespaces" -}}
{{- $names := .Values.operator.namespaces | default (list .Release.Namespace) -}}
{{- if ne (join "," $names) "homelab-autoscaler-system" -}}
{{ join "," $names }}
{{- end -}}
{{- end }}

{{/* Refusals no schema can say: a combination of values. One Temporal at a time: the bundled one, the dev server,
or an existing one at temporal.address. */}}
{{- define "homelab-autoscaler.checks" -}}
{{- $t := .Values.temporal -}}
{{- if and $t.bundled.enabled $t.devServer.enabled -}}
{{- fail "temporal.bundled.enabled and temporal.devServer.enabled are both true: choose one Temporal (the development-only dev server needs temporal.bundled.enabled=false)" -}}
{{- end -}}
{{- $ours := ternary "temporal.bundled.enabled" "temporal.devServer.enabled" $t.bundled.enabled -}}
{{- if or $t.bundled.enabled $t.devServer.enabled -}}
{{- if $t.address -}}
{{- fail (printf "temporal.address (%s) is for an existing Temporal, and %s is true: set it to false, or leave the address empty" $t.address $ours) -}}
{{- end -}}
{{- if or $t.tls.secretName $t.apiKey.secretName -}}
{{- fail (printf "temporal.tls.secretName and temporal.apiKey.secretName are for an existing Temporal; the chart's own (%s) has neither: leave them empty" $ours) -}}
{{- end -}}
{{- end -}}
{{- $pg := $t.externalPostgresql -}}
{{- if $pg.host -}}
{{- if not $t.bundled.enabled -}}
{{- fail (printf "temporal.externalPostgresql.host (%s) is the bundled server's database: it needs temporal.bundled.enabled" $pg.host) -}}
{{- end -}}
{{- if not $pg.passwordSecret -}}
{{- fail "temporal.externalPostgresql.passwordSecret: the Secret holding the password (key `password`) of your PostgreSQL is required with temporal.externalPostgresql.host" -}}
{{- end -}}
{{- else if or $pg.passwordSecret $pg.tls.enabled $pg.tls.caSecret -}}
{{- fail "temporal.externalPostgresql.passwordSecret and .tls are for an external PostgreSQL: set temporal.externalPostgresql.host, or leave them unset" -}}
{{- end -}}
{{- if and $pg.tls.caSecret (not $pg.tls.enabled) -}}
{{- fail "temporal.externalPostgresql.tls.caSecret is given but temporal.externalPostgresql.tls.enabled is false: enable TLS, or leave the CA unset" -}}
{{- end -}}
{{- $ca := .Values.clusterAutoscaler -}}
{{- if and $ca.enabled .Values.certManager.enabled (include "homelab-autoscaler.clusterAutoscalerElsewhere" .) -}}
{{- fail (printf "clusterAutoscaler.namespace (%s) is not the release's, and certManager.enabled is true: a cert-manager Issuer signs in its own namespace only, so cluster-autoscaler's client certificate cannot be issued there; leave clusterAutoscaler.namespace empty, or use the certs step (certManager.enabled=false)" $ca.namespace) -}}
{{- end -}}
{{- end }}

{{/* cluster-autoscaler's namespace (clusterAutoscaler.namespace, else the release's). */}}
{{- define "homelab-autoscaler.clusterAutoscalerNamespace" -}}
{{ .Values.clusterAutoscaler.namespace | default .Release.Namespace }}
{{- end }}

{{/* "true" when the chart's cluster-autoscaler runs outside the release's namespace, else empty. */}}
{{- define "homelab-autoscaler.clusterAutoscalerElsewhere" -}}
{{- if and .Values.clusterAutoscaler.enabled (ne (include "homelab-autoscaler.clusterAutoscalerNamespace" .) .Release.Namespace) -}}
true
{{- end -}}
{{- end }}

{{/* The Secret of the operator's client certificate for its Temporal: yours for an existing Temporal
(temporal.tls.secretName), the install's for the bundled one (whose frontend requires one), else none. */}}
{{- define "homelab-autoscaler.temporalTLSSecret" -}}
{{- if .Values.temporal.tls.secretName -}}
{{ .Values.temporal.tls.secretName }}
{{- else if .Values.temporal.bundled.enabled -}}
homelab-autoscaler-temporal-tls
{{- end -}}
{{- end }}

{{/* The client certificate's files, as the operator's settings name them (the Secret mounted at /etc/temporal-tls). */}}
{{- define "homelab-autoscaler.temporalTLSEnv" -}}
- name: HOMELAB_AUTOSCALER_TEMPORAL_TLS_CERT
  value: /etc/temporal-tls/tls.crt
- name: HOMELAB_AUTOSCALER_TEMPORAL_TLS_KEY
  value: /etc/temporal-tls/tls.key
- name: HOMELAB_AUTOSCALER_TEMPORAL_TLS_CA
  value: /etc/temporal-tls/ca.crt
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
{{- if include "homelab-autoscaler.temporalTLSSecret" .root }}
{{ include "homelab-autoscaler.temporalTLSEnv" . }}
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
# cluster-autoscaler reaches the provider through its Service, so it listens on every interface, with mTLS: only a
# client certificate of the install's CA is served (the certs Job or cert-manager issues it; provider.plaintext is
# the documented opt-out). The files are re-read when the Secret is renewed.
- name: HOMELAB_AUTOSCALER_PROVIDER_ADDRESS
  value: 0.0.0.0:8086
{{- if not $v.provider.plaintext }}
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
# The kubelet probes the pod IP, not the loopback.
- name: HOMELAB_AUTOSCALER_HEALTH_HOST
  value: 0.0.0.0
- name: HOMELAB_AUTOSCALER_HEALTH_PORT
  value: "8081"
{{- if has $role (list "run" "watch") }}
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
- name: health
  containerPort: 8081
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
{{- if include "homelab-autoscaler.temporalTLSSecret" .root }}
- name: temporal-tls
  mountPath: /etc/temporal-tls
  readOnly: true
{{- end }}
{{- if and $serves (not $v.provider.plaintext) }}
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
{{- with include "homelab-autoscaler.temporalTLSSecret" .root }}
# Until the certs step (or cert-manager, or you) has written it, the Pod waits.
- name: temporal-tls
  secret:
    secretName: {{ . }}
{{- end }}
{{- if and $serves (not $v.provider.plaintext) }}
# Until the certs Job (or cert-manager) has written it, the Pod waits; re-read when renewed.
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

{{/* The Pod's security context: the image's non-root user (.user, else the operator image's 65532), the runtime's
seccomp profile. */}}
{{- define "homelab-autoscaler.podSecurityContext" -}}
{{- $user := .user | default 65532 -}}
runAsNonRoot: true
runAsUser: {{ $user }}
runAsGroup: {{ $user }}
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
      {{- if $v.temporal.bundled.enabled }}
      initContainers:
        {{- include "homelab-autoscaler.setupContainer" .root | nindent 8 }}
      {{- end }}
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

{{/*
The bundled Temporal's setup, first in every operator Pod (deploy/components/temporal/setup-init.yaml): the
PostgreSQL password Secret when absent (not for an external PostgreSQL: that password is the user's), then, once
the frontend answers (at most 10 minutes), the namespace with its retention and the search attributes. Idempotent.
*/}}
{{- define "homelab-autoscaler.setupContainer" -}}
{{- $t := .Values.temporal -}}
- name: temporal-setup
  image: {{ include "homelab-autoscaler.image" . }}
  {{- with .Values.image.pullPolicy }}
  imagePullPolicy: {{ . }}
  {{- end }}
  args:
    - temporal-setup
    - --retention
    - {{ $t.bundled.retention | quote }}
    {{- if not $t.externalPostgresql.host }}
    - --postgresql-secret
    - {{ $t.bundled.postgresql.passwordSecret }}
    {{- end }}
  env:
    - name: HOMELAB_AUTOSCALER_TEMPORAL_ADDRESS
      value: temporal-frontend:7233
    - name: HOMELAB_AUTOSCALER_TEMPORAL_NAMESPACE
      value: {{ $t.namespace | quote }}
    - name: HOMELAB_AUTOSCALER_POD_NAMESPACE
      valueFrom:
        fieldRef:
          fieldPath: metadata.namespace
    {{- /* The bundled frontend requires the operator's client certificate, this step's too. */}}
    {{- include "homelab-autoscaler.temporalTLSEnv" . | nindent 4 }}
  resources:
    requests:
      cpu: 10m
      memory: 64Mi
    limits:
      memory: 256Mi
  securityContext:
    {{- include "homelab-autoscaler.containerSecurityContext" . | nindent 4 }}
  volumeMounts:
    - name: tmp
      mountPath: /tmp
    - name: temporal-tls
      mountPath: /etc/temporal-tls
      readOnly: true
{{- end }}

{{/*
The bundled server's database as its Pods reach it (.root; .prefix names the variables: POSTGRES_ for the server,
SQL_ for temporal-sql-tool): the chart's PostgreSQL, or temporal.externalPostgresql.
*/}}
{{- define "homelab-autoscaler.postgresqlEnv" -}}
{{- $b := .root.Values.temporal.bundled -}}
{{- $pg := .root.Values.temporal.externalPostgresql -}}
{{- $server := eq .prefix "POSTGRES_" -}}
- name: {{ .prefix }}HOST
  value: {{ $pg.host | default "temporal-postgresql" | quote }}
- name: {{ .prefix }}PORT
  value: {{ (ternary $pg.port 5432 (not (empty $pg.host))) | toString | quote }}
- name: {{ .prefix }}USER
  value: {{ (ternary $pg.user "temporal" (not (empty $pg.host))) | quote }}
- name: {{ .prefix }}{{ ternary "PWD" "PASSWORD" $server }}
  valueFrom:
    secretKeyRef:
      name: {{ $pg.passwordSecret | default $b.postgresql.passwordSecret }}
      key: password
{{- if and $pg.host $pg.tls.enabled }}
- name: {{ .prefix }}{{ ternary "TLS_ENABLED" "TLS" $server }}
  value: "true"
{{- with $pg.tls.caSecret }}
- name: {{ $.prefix }}TLS_CA_FILE
  value: /etc/temporal/postgresql-tls/ca.crt
{{- end }}
{{- end }}
{{- end }}

{{/* The certs step's Pod template (the Job's and the CronJob's). */}}
{{- define "homelab-autoscaler.certsPod" -}}
metadata:
  labels:
    app.kubernetes.io/name: homelab-autoscaler
    app.kubernetes.io/component: certs
spec:
  serviceAccountName: homelab-autoscaler-certs
  restartPolicy: OnFailure
  securityContext:
    {{- include "homelab-autoscaler.podSecurityContext" (dict) | nindent 4 }}
  {{- /* The operator's ground: never a machine the operator may power off. */}}
  {{- include "homelab-autoscaler.scheduling" (dict "root" . "placement" .Values.operator) | nindent 2 }}
  containers:
    - name: certs
      image: {{ include "homelab-autoscaler.image" . }}
      {{- with .Values.image.pullPolicy }}
      imagePullPolicy: {{ . }}
      {{- end }}
      args: ["certs"]
      env:
        - name: HOMELAB_AUTOSCALER_CERTS_NAMESPACE
          valueFrom:
            fieldRef:
              fieldPath: metadata.namespace
        {{- if .Values.temporal.bundled.enabled }}
        - name: HOMELAB_AUTOSCALER_CERTS_TEMPORAL
          value: "true"
        {{- end }}
        {{- if include "homelab-autoscaler.clusterAutoscalerElsewhere" . }}
        - name: HOMELAB_AUTOSCALER_CERTS_CLIENT_NAMESPACE
          value: {{ include "homelab-autoscaler.clusterAutoscalerNamespace" . }}
        {{- end }}
      resources:
        {{- toYaml .Values.certs.resources | nindent 8 }}
      securityContext:
        {{- include "homelab-autoscaler.containerSecurityContext" . | nindent 8 }}
{{- end }}

{{/* The port of the operator's Temporal frontend: the schema holds temporal.address to host:port. */}}
{{- define "homelab-autoscaler.temporalPort" -}}
{{- include "homelab-autoscaler.temporalAddress" . | splitList ":" | last -}}
{{- end }}

{{/* cluster-autoscaler's externalgrpc cloud-config: where the provider listens, and its client certificate unless
provider.plaintext (all three of cert, key and cacert, or none: mTLS or plaintext, nothing between). */}}
{{- define "homelab-autoscaler.clusterAutoscalerCloudConfig" -}}
address: homelab-autoscaler-provider.{{ .Release.Namespace }}.svc:8086
grpc_timeout: 10s
{{- if not .Values.provider.plaintext }}
cert: /etc/cluster-autoscaler/tls/tls.crt
key: /etc/cluster-autoscaler/tls/tls.key
cacert: /etc/cluster-autoscaler/tls/ca.crt
{{- end }}
{{- end }}
