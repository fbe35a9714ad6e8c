package config

import "time"

// Seconds converts a *_secs setting (fractional seconds) into a duration.
func Seconds(f float64) time.Duration { return time.Duration(f * float64(time.Second)) }
