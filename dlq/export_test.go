package dlq

// Exported for the tests of package dlq_test.
var (
	CapLabel     = capLabel
	LabelMatches = labelMatches
)
