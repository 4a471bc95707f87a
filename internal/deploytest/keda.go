package deploytest

import (
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The KEDA objects, keda.sh/v1alpha1. KEDA's own Go package
// (github.com/kedacore/keda/v2/apis/keda/v1alpha1) holds its admission
// webhooks too and so pulls in controller-runtime, client-go and KEDA's
// whole module; these types cover the fields of the KEDA CRDs that
// deploy/kubernetes may use, with KEDA's JSON names (keda.sh/docs, "Scaling
// Deployments" and "Authentication"), so that a misspelt or misplaced field
// fails the strict decode.

// ScaledObject is a KEDA ScaledObject.
type ScaledObject struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              ScaledObjectSpec `json:"spec"`
}

// ScaledObjectSpec is the spec of a ScaledObject.
type ScaledObjectSpec struct {
	ScaleTargetRef        *ScaleTarget    `json:"scaleTargetRef"`
	PollingInterval       *int32          `json:"pollingInterval,omitempty"`
	InitialCooldownPeriod *int32          `json:"initialCooldownPeriod,omitempty"`
	CooldownPeriod        *int32          `json:"cooldownPeriod,omitempty"`
	IdleReplicaCount      *int32          `json:"idleReplicaCount,omitempty"`
	MinReplicaCount       *int32          `json:"minReplicaCount,omitempty"`
	MaxReplicaCount       *int32          `json:"maxReplicaCount,omitempty"`
	Advanced              *AdvancedConfig `json:"advanced,omitempty"`
	Triggers              []ScaleTrigger  `json:"triggers"`
	Fallback              *Fallback       `json:"fallback,omitempty"`
}

// ScaleTarget names the scaled workload (a Deployment unless Kind says
// otherwise).
type ScaleTarget struct {
	Name                   string `json:"name"`
	APIVersion             string `json:"apiVersion,omitempty"`
	Kind                   string `json:"kind,omitempty"`
	EnvSourceContainerName string `json:"envSourceContainerName,omitempty"`
}

// AdvancedConfig holds the options of the HorizontalPodAutoscaler KEDA
// creates.
type AdvancedConfig struct {
	HorizontalPodAutoscalerConfig *HPAConfig `json:"horizontalPodAutoscalerConfig,omitempty"`
	RestoreToOriginalReplicaCount bool       `json:"restoreToOriginalReplicaCount,omitempty"`
}

// HPAConfig is the name and scaling behaviour of that HorizontalPodAutoscaler.
type HPAConfig struct {
	Behavior *autoscalingv2.HorizontalPodAutoscalerBehavior `json:"behavior,omitempty"`
	Name     string                                         `json:"name,omitempty"`
}

// Fallback is the replica count used while the scaler fails.
type Fallback struct {
	FailureThreshold int32  `json:"failureThreshold"`
	Replicas         int32  `json:"replicas"`
	Behavior         string `json:"behavior,omitempty"`
}

// ScaleTrigger is one scaler; Metadata is the scaler's own settings (for
// type kafka, see KafkaTriggerMetadata).
type ScaleTrigger struct {
	Type              string             `json:"type"`
	Name              string             `json:"name,omitempty"`
	UseCachedMetrics  bool               `json:"useCachedMetrics,omitempty"`
	Metadata          map[string]string  `json:"metadata"`
	AuthenticationRef *AuthenticationRef `json:"authenticationRef,omitempty"`
	MetricType        string             `json:"metricType,omitempty"`
}

// AuthenticationRef names a TriggerAuthentication (or, with Kind, a
// ClusterTriggerAuthentication).
type AuthenticationRef struct {
	Name string `json:"name"`
	Kind string `json:"kind,omitempty"`
}

// TriggerAuthentication is a KEDA TriggerAuthentication; only its secret and
// environment references are covered.
type TriggerAuthentication struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              TriggerAuthenticationSpec `json:"spec"`
}

// TriggerAuthenticationSpec maps scaler parameters to Secret keys or to
// environment variables of the scaled container.
type TriggerAuthenticationSpec struct {
	SecretTargetRef []SecretTargetRef `json:"secretTargetRef,omitempty"`
	Env             []EnvTargetRef    `json:"env,omitempty"`
}

// SecretTargetRef sets the scaler parameter Parameter from key Key of the
// Secret Name.
type SecretTargetRef struct {
	Parameter string `json:"parameter"`
	Name      string `json:"name"`
	Key       string `json:"key"`
}

// EnvTargetRef sets the scaler parameter Parameter from the environment
// variable Name of the scaled container.
type EnvTargetRef struct {
	Parameter     string `json:"parameter"`
	Name          string `json:"name"`
	ContainerName string `json:"containerName,omitempty"`
}

// KafkaTriggerMetadata are the metadata keys of KEDA's kafka scaler, with
// what each accepts ("" for free text): keda.sh/docs, "Apache Kafka"
// scaler. sasl and tls may be given here or by a TriggerAuthentication.
var KafkaTriggerMetadata = map[string][]string{
	"bootstrapServers":           nil,
	"consumerGroup":              nil,
	"topic":                      nil,
	"lagThreshold":               {"integer"},
	"activationLagThreshold":     {"integer"},
	"offsetResetPolicy":          {"earliest", "latest"},
	"allowIdleConsumers":         {"true", "false"},
	"excludePersistentLag":       {"true", "false"},
	"scaleToZeroOnInvalidOffset": {"true", "false"},
	"limitToPartitionsWithLag":   {"true", "false"},
	"partitionLimitation":        nil,
	"version":                    nil,
	"sasl":                       {"none", "plaintext", "scram_sha256", "scram_sha512", "gssapi", "oauthbearer"},
	"tls":                        {"enable", "disable"},
}

// KafkaAuthParameters are the parameters a TriggerAuthentication may give
// the kafka scaler.
var KafkaAuthParameters = []string{"sasl", "username", "password", "tls", "ca", "cert", "key", "keyPassword", "unsafeSsl"}
