package projection

// DefaultEventsTopic is the projection events topic upstream services
// publish to (SPEC §2), the default of Config.Topic and of the commands'
// --topic flag.
const DefaultEventsTopic = "causet.projection-events.v1"
