{{/* Names: <fullname>-operator, -webhook, -bridge; cluster-scoped objects carry the fullname too. */}}
{{- define "gpulane.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpulane.fullname" -}}
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

{{- define "gpulane.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "gpulane.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gpulane
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels of one component: (dict "ctx" $ "component" "operator"). */}}
{{- define "gpulane.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpulane.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "gpulane.componentLabels" -}}
{{ include "gpulane.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "gpulane.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion (toString .Values.image.tag)) }}
{{- end }}

{{- define "gpulane.operator.fullname" -}}{{ include "gpulane.fullname" . }}-operator{{- end }}
{{- define "gpulane.webhook.fullname" -}}{{ include "gpulane.fullname" . }}-webhook{{- end }}
{{- define "gpulane.bridge.fullname" -}}{{ include "gpulane.fullname" . }}-bridge{{- end }}
{{- define "gpulane.ui.fullname" -}}{{ include "gpulane.fullname" . }}-ui{{- end }}

{{- define "gpulane.operator.serviceAccountName" -}}
{{- default (include "gpulane.operator.fullname" .) .Values.operator.serviceAccount.name }}
{{- end }}
{{/* The operator's username: the one writer of a GpuJob's status beyond an executor's outcome. */}}
{{- define "gpulane.operator.username" -}}
system:serviceaccount:{{ .Release.Namespace }}:{{ include "gpulane.operator.serviceAccountName" . }}
{{- end }}
{{- define "gpulane.webhook.serviceAccountName" -}}
{{- default (include "gpulane.webhook.fullname" .) .Values.webhook.serviceAccount.name }}
{{- end }}
{{- define "gpulane.bridge.serviceAccountName" -}}
{{- default (include "gpulane.bridge.fullname" .) .Values.bridge.serviceAccount.name }}
{{- end }}
{{- define "gpulane.ui.serviceAccountName" -}}
{{- default (include "gpulane.ui.fullname" .) .Values.ui.serviceAccount.name }}
{{- end }}

{{/* Where the operator creates backend pods: the one named, else "<release namespace>-backends" (the chart's). */}}
{{- define "gpulane.backendNamespace" -}}
{{- if .Values.operator.backendNamespace }}
{{- .Values.operator.backendNamespace }}
{{- else }}
{{- $name := printf "%s-backends" .Release.Namespace }}
{{- if gt (len $name) 63 }}
{{- fail (printf "the backend namespace %q is longer than 63 characters: name one in operator.backendNamespace" $name) }}
{{- end }}
{{- $name }}
{{- end }}
{{- end }}

{{/* The webhook's Secret: generated, or the user's. */}}
{{- define "gpulane.webhook.tlsSecretName" -}}
{{- default (printf "%s-tls" (include "gpulane.webhook.fullname" .)) .Values.webhook.tls.existingSecret }}
{{- end }}

{{/* The bridge's keys Secret: the user's, or the one rendered from bridge.keys.inline. */}}
{{- define "gpulane.bridge.keysSecretName" -}}
{{- default (printf "%s-keys" (include "gpulane.bridge.fullname" .)) .Values.bridge.keys.existingSecret }}
{{- end }}

{{/* Pod-level settings shared by every component: (dict "ctx" $ "values" .Values.operator "component" "operator"). */}}
{{- define "gpulane.podCommon" -}}
{{- with .ctx.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml .ctx.Values.podSecurityContext | nindent 2 }}
{{- with .values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if .values.affinity }}
affinity:
  {{- toYaml .values.affinity | nindent 2 }}
{{- else if gt (int (.values.replicas | default 1)) 1 }}
# Replicas on different nodes where there are several (preferred: one node still runs them all).
affinity:
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector:
            matchLabels:
              {{- include "gpulane.selectorLabels" (dict "ctx" .ctx "component" .component) | nindent 14 }}
{{- end }}
{{- end }}

{{/* HOME points at the writable /tmp emptyDir (the root filesystem is read-only). */}}
{{- define "gpulane.env" -}}
- name: HOME
  value: /tmp
{{- end }}

{{/* NetworkPolicy peers: the namespaces of a list of names. */}}
{{- define "gpulane.namespacePeers" -}}
{{- range . }}
- namespaceSelector:
    matchLabels: {kubernetes.io/metadata.name: {{ . }}}
{{- end }}
{{- end }}

{{/* The admission mode in effect. "auto" is "policy" where the apiserver serves MutatingAdmissionPolicy v1
(Kubernetes 1.36 or later; helm asks the cluster, `helm template` needs --api-versions to say so), else "webhook". */}}
{{- define "gpulane.admission.mode" -}}
{{- if ne .Values.admission.mode "auto" }}{{ .Values.admission.mode }}
{{- else if .Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy" }}policy
{{- else }}webhook{{ end }}
{{- end }}
{{/* The webhook runs unless the mode is "policy" (the apiserver's own policies alone). "true" or "". */}}
{{- define "gpulane.webhook.on" -}}
{{- if and .Values.webhook.enabled (ne (include "gpulane.admission.mode" .) "policy") }}true{{ end }}
{{- end }}
{{/* The apiserver's admission policies (CEL) are installed in mode policy or webhook+policy. */}}
{{- define "gpulane.policies.on" -}}
{{- if has (include "gpulane.admission.mode" .) (list "policy" "webhook+policy") }}true{{ end }}
{{- end }}
