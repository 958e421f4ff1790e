-- carts records each cart that was sold: a cart's lines are sold in one
-- transaction with its row, so either the cart and every one of its sales
-- exist, or none of them. lines is how many sales it has; a reader can
-- check that count against sales.cart.
CREATE TABLE carts (
    token        text        PRIMARY KEY,
    principal    text        NOT NULL,
    lines        integer     NOT NULL CHECK (lines BETWEEN 1 AND 50),
    committed_at timestamptz NOT NULL DEFAULT now()
);

-- cart names the cart a sale belongs to; null for a reservation sold alone.
ALTER TABLE sales ADD COLUMN cart text REFERENCES carts (token);

CREATE INDEX sales_by_cart ON sales (cart) WHERE cart IS NOT NULL;
