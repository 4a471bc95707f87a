package dlq

// Exported for the tests of package dlq_test.
var (
	LabelMatches = labelMatches
)
