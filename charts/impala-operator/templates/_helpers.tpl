{{/* Chart name, truncated to the 63-character label limit. */}}
{{- define "impala-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: <release>-<chart>, or the release name when it already contains the chart name. */}}
{{- define "impala-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* chart label value: name-version. */}}
{{- define "impala-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels that select the operator pod (immutable on the Deployment). */}}
{{- define "impala-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "impala-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/component: operator
{{- end }}

{{/* Labels on every object of the chart. */}}
{{- define "impala-operator.labels" -}}
helm.sh/chart: {{ include "impala-operator.chart" . }}
{{ include "impala-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: impalajob
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The operator's ServiceAccount. */}}
{{- define "impala-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "impala-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Rules kopf itself needs cluster-wide: discovering the ImpalaJob CRD (and, when watching
every namespace, namespaces coming and going). */}}
{{- define "impala-operator.frameworkRules" -}}
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [list, watch]
{{- if not .Values.watchNamespaces }}
- apiGroups: [""]
  resources: [namespaces]
  verbs: [list, watch]
{{- end }}
# Kueue (cluster-scoped, read only): where an admission puts a queued job's pods, and the
# priority its Workload gets.
- apiGroups: [kueue.x-k8s.io]
  resources: [resourceflavors, workloadpriorityclasses]
  verbs: [get]
- apiGroups: [scheduling.k8s.io]
  resources: [priorityclasses]
  verbs: [get]
{{- end }}

{{/* Rules for reconciling ImpalaJobs and their children (keep equal to manifests/rbac.yaml). */}}
{{- define "impala-operator.jobRules" -}}
- apiGroups: [impala.dev]
  resources: [impalajobs]
  verbs: [get, list, watch, patch, update, delete]
- apiGroups: [impala.dev]
  resources: [impalajobs/status]
  verbs: [get, patch, update]
- apiGroups: [impala.dev]
  resources: [impalajobs/finalizers]
  verbs: [update]
- apiGroups: [""]
  resources: [pods, services, configmaps]
  verbs: [create, get, list, watch, patch, update, delete]
- apiGroups: [apps]
  resources: [deployments]
  verbs: [create, get, list, watch, patch, update, delete]
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [create, get, list, watch, patch, update, delete]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [create, get, list, watch, patch, update, delete]
- apiGroups: [""]
  resources: [persistentvolumeclaims]
  verbs: [get, list, watch]
# Each job's auth Secret, applied but never read: the operator derives the tokens it holds.
- apiGroups: [""]
  resources: [secrets]
  verbs: [create, patch]
- apiGroups: [""]
  resources: [events]
  verbs: [create, patch]
# Kueue: the Workload of each queued job (created, replaced when its pod sets change), its
# status updated as jobframework does (quota handed back after an eviction, Finished), and
# watched (list, watch) for the operator's index of them instead of a GET per tick.
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads]
  verbs: [create, get, list, watch, delete]
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads/status]
  verbs: [update]
{{- end }}
