package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"

	"github.com/idemlab/idemlab/internal/users"
)

// userCommand is `web user set NAME [-role customer|admin] [-token]`: how
// accounts get real credentials outside demo mode. It creates the account
// (or changes its role), sets its password from the PASSWORD environment
// variable when that is set, and with -token issues a new API token, printed
// once and stored only as its hash. Read the password into the variable
// without echoing it, so it stays out of the shell's history:
//
//	read -rs PASSWORD && PASSWORD="$PASSWORD" web user set alice -token
func userCommand(ctx context.Context, cfg config, getenv func(string) string, logger *slog.Logger, args []string, stdout io.Writer) error {
	if len(args) < 2 || args[0] != "set" {
		return errors.New("usage: web user set NAME [-role customer|admin] [-token]  (PASSWORD from the environment)")
	}
	name := args[1]
	fs := flag.NewFlagSet("web user set", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	role := fs.String("role", "", "customer or admin (default: keep the account's, customer for a new one)")
	token := fs.Bool("token", false, "issue a new API token and print it")
	if err := fs.Parse(args[2:]); err != nil {
		return fmt.Errorf("web user set: %w", err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("web user set: unexpected arguments %q", fs.Args())
	}
	password := getenv("PASSWORD")
	if password == "" && !*token && *role == "" {
		return errors.New("web user set: nothing to do: set PASSWORD, -token or -role")
	}

	pool, direct, migrator, err := openMigrated(ctx, cfg, logger)
	if err != nil {
		return err
	}
	defer pool.Close()
	defer direct.Close()
	defer migrator.Close()
	store := users.NewStore(pool).WithPasswordCost(cfg.PasswordCost)

	if *role == "" {
		*role = users.RoleCustomer
		if u, err := store.ByName(ctx, name); err == nil {
			*role = u.Role
		} else if !errors.Is(err, users.ErrNotFound) {
			return err
		}
	}
	u, err := store.Put(ctx, name, *role)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "user %s (%s, id %d)\n", u.Name, u.Role, u.ID)
	if password != "" {
		if err := store.SetPassword(ctx, name, password); err != nil {
			return err
		}
		fmt.Fprintln(stdout, "password set")
	}
	if *token {
		t, err := store.NewToken(ctx, name)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "API token (shown once): %s\n", t)
	}
	return nil
}
