-- +goose Up

-- Outside demo mode people sign in with a name and a password. Only a bcrypt
-- hash is stored (cost and salt inside it); NULL means the account has no
-- password and cannot sign in to the browser outside demo mode.
ALTER TABLE users ADD COLUMN password_bcrypt text;

-- +goose Down
ALTER TABLE users DROP COLUMN password_bcrypt;
