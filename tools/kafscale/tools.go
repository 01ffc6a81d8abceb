//go:build tools

// Package tools pins KafScale's broker, which the real-broker tests run (scripts/install-kafscale.sh builds it).
package tools

import (
	_ "github.com/KafScale/platform/cmd/broker"
)
